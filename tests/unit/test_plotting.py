"""course_lib.plotting's accuracy plots: what the axes show."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from course_lib.plotting import accuracy_vs_length, per_position_accuracy


def test_per_position_accuracy_plots_one_curve_per_label_on_positions_from_1():
    ax = per_position_accuracy({"RNN": torch.tensor([0.9, 0.5, 0.2]), "attention": [1.0, 0.95, 0.9]})
    try:
        assert [line.get_label() for line in ax.get_lines()] == ["RNN", "attention"]
        assert list(ax.get_lines()[0].get_xdata()) == [1, 2, 3]
        assert ax.get_xlabel() == "output position" and ax.get_ylabel() == "token accuracy"
        assert ax.get_ylim() == (-0.02, 1.02) and ax.get_legend() is not None
    finally:
        plt.close(ax.figure)


def test_accuracy_vs_length_plots_the_given_lengths():
    ax = accuracy_vs_length({"greedy": ([5, 10, 20], [1.0, 0.8, 0.4])}, title="t", ylabel="exact")
    try:
        line = ax.get_lines()[0]
        assert list(line.get_xdata()) == [5, 10, 20] and list(line.get_ydata()) == [1.0, 0.8, 0.4]
        assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == ("t", "input length (tokens)", "exact")
        assert ax.get_ylim() == (-0.02, 1.02) and ax.get_legend() is not None
    finally:
        plt.close(ax.figure)
