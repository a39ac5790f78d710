"""Running a notebook top to bottom with nbclient, without waiting out a cell's whole timeout.

nbclient waits for a cell's ``execute_reply`` with one poll of the kernel's shell socket, as
long as the cell's timeout (600 s in the course's tests). While it waits it may also *send* on
that socket: when a cell displays into an ipywidgets ``Output`` widget (course_lib's explorers
do), nbclient plays the widget's front end and sends the widget's new state back to the kernel.
jupyter_client sends through a blocking shadow of the asyncio socket (``Session.send``), and a
send makes libzmq take in whatever has arrived and reset the socket's edge-triggered
``ZMQ_FD``; pyzmq's asyncio side is not told. A reply that arrived just before such a send
therefore wakes nothing: the poll sleeps until its timeout, then finds the reply, and the
cell "completes" minutes late with the kernel idle all along. (Measured with nbclient 0.11,
jupyter_client 8.10, pyzmq 27.3: 10 of 328 cells that displayed into an ``Output`` widget
waited their whole timeout though the kernel had replied within 0.2 s; none of 492 with the
fix below.)

:class:`NotebookClient` is nbclient's with a kernel manager whose clients re-check the shell
socket after every send (``socket.get(zmq.EVENTS)`` on the asyncio socket makes pyzmq look
at it again), so a reply wakes its poll whenever it arrives.

A cell that floods its output costs at most nbclient's ``iopub_timeout`` (4 s) more: the
kernel's IOPub socket drops what is past its high-water mark, its ``idle`` status included,
and nbclient stops waiting for it then.
"""

from __future__ import annotations

from typing import Any

import nbclient
import zmq
from jupyter_client import AsyncKernelManager
from jupyter_client.channels import AsyncZMQSocketChannel
from traitlets import Type, default

__all__ = ["NotebookClient", "KernelManager", "RecheckingShellChannel"]


class RecheckingShellChannel(AsyncZMQSocketChannel):
    """The shell channel, looked at again by pyzmq after each send (see the module docstring)."""

    def send(self, msg: dict[str, Any]) -> None:
        super().send(msg)  # (through a blocking shadow of the socket: it may take in a reply unseen)
        if self.socket is not None and not self.socket.closed:
            self.socket.get(zmq.EVENTS)  # pyzmq's asyncio socket: wake any poll for what is there


class KernelManager(AsyncKernelManager):
    """jupyter_client's asynchronous kernel manager, whose asynchronous clients use
    :class:`RecheckingShellChannel`."""

    def client(self, **kwargs: Any) -> Any:
        client = super().client(**kwargs)
        if issubclass(client.shell_channel_class, AsyncZMQSocketChannel):
            client.shell_channel_class = RecheckingShellChannel  # (the channel is made when first used)
        return client


class NotebookClient(nbclient.NotebookClient):
    """``nbclient.NotebookClient`` with :class:`KernelManager` (same arguments, same results)."""

    kernel_manager_class = Type(config=True, help="The kernel manager class to use.")

    @default("kernel_manager_class")
    def _kernel_manager_class_default(self) -> type:
        return KernelManager
