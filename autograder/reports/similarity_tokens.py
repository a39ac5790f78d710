"""What a student's answer is to ``workbook similarity``: a sequence of normalised tokens,
each with the place in the answer it came from (to highlight it later).

- **Code** (:func:`code_tokens`): read with Python's own ``tokenize``; comments, blank lines
  and docstrings dropped; every name a student chooses becomes ``V`` (variables, parameters,
  functions, classes, the attributes the cell assigns), every number ``N``, every string
  ``S``; keywords, operators and the attributes of a library (``.softmax``, ``.transpose``)
  stay as written. Each run of simple statements in one block (assignments, calls, returns
  between two compound statements) is put in a canonical order, so independent statements
  written in another order read the same. Code that ``tokenize`` cannot read (a syntax
  error, an IPython magic) is read line by line by a plain pattern instead.
- **Written answers** (:func:`text_tokens`): lower-case words, markdown and punctuation
  dropped, the sentences in a canonical order.

Only the first :data:`MAX_CHARS` characters of an answer are read (an honest answer is a
few hundred); the report says when an answer was cut.
"""

from __future__ import annotations

import ast
import io
import keyword
import re
import tokenize
import unicodedata
from dataclasses import dataclass, field

__all__ = ["Tokens", "code_tokens", "text_tokens", "MAX_CHARS"]

MAX_CHARS = 20_000  # characters of one answer read and shown (an honest one has a few hundred)


@dataclass
class Tokens:
    """Normalised tokens in canonical order (``words``), with each one's ``(start, end)``
    character span in ``source`` (the answer as read, at most :data:`MAX_CHARS` long)."""

    source: str
    words: list[str] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    cut: bool = False  # the answer was longer than MAX_CHARS


# a statement: its block depth, whether it opens or belongs to a compound statement, its tokens
_Statement = tuple[int, bool, list[tuple[str, int, int]]]

_COMPOUND = {"if", "elif", "else", "for", "while", "try", "except", "finally", "with", "def", "class", "async", "@",
             "match", "case"}
_KEYWORDS = set(keyword.kwlist)
_AUGMENTED = {"=", "+=", "-=", "*=", "/=", "//=", "%=", "@=", "&=", "|=", "^=", ">>=", "<<=", "**="}


def _canonical(statements: list[_Statement]) -> tuple[list[str], list[tuple[int, int]]]:
    """The statements' tokens with each run of simple statements at one depth sorted, and a
    ``{``/``}`` where a block opens or closes and ``;`` after each statement."""
    ordered: list[_Statement] = []
    run: list[_Statement] = []

    def flush() -> None:
        ordered.extend(sorted(run, key=lambda s: [t[0] for t in s[2]]))
        run.clear()
    for statement in statements:
        if statement[1] or (run and run[0][0] != statement[0]):
            flush()
        (ordered if statement[1] else run).append(statement)
    flush()
    words: list[str] = []
    spans: list[tuple[int, int]] = []
    depth = 0
    for level, _, toks in ordered:
        if not toks:
            continue
        start = toks[0][1]
        words += ["{" if level > depth else "}"] * abs(level - depth)
        spans += [(start, start)] * abs(level - depth)
        depth = level
        for word, a, b in toks:
            words.append(word)
            spans.append((a, b))
        words.append(";")
        spans.append((toks[-1][2], toks[-1][2]))
    return words, spans


def _offsets(source: str) -> list[int]:
    """The character offset of each line's start (``tokenize`` gives rows and columns of the
    lines ``readline`` gives: split at ``\n`` alone, not at ``\r``, ``\x0c`` or ``\u2028``)."""
    starts = [0]
    for line in source.split("\n"):
        starts.append(starts[-1] + len(line) + 1)
    return starts


def _assigned_attributes(raw: list[tokenize.TokenInfo]) -> set[str]:
    """Attributes the cell assigns (``self.proj = ...``): names the student chose."""
    names = set()
    for i in range(1, len(raw) - 1):
        if raw[i].type == tokenize.NAME and raw[i - 1].string == "." and raw[i + 1].string in _AUGMENTED:
            names.add(_as_python_reads(raw[i].string))
    return names


_FSTRING_START = getattr(tokenize, "FSTRING_START", -1)  # Python 3.12+ splits an f-string into parts
_FSTRING_END = getattr(tokenize, "FSTRING_END", -1)
_SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER,
            getattr(tokenize, "FSTRING_MIDDLE", -1)}
_NAME, _NUMBER, _STRING, _NEWLINE = tokenize.NAME, tokenize.NUMBER, tokenize.STRING, tokenize.NEWLINE
_INDENT, _DEDENT = tokenize.INDENT, tokenize.DEDENT


def _as_python_reads(name: str) -> str:
    """A name as Python reads it: NFKC-normalised (``x.𝗌𝗈𝖿𝗍𝗆𝖺𝗑`` is ``x.softmax``)."""
    return name if name.isascii() else unicodedata.normalize("NFKC", name)


def _python_statements(source: str) -> list[_Statement]:
    """Statements as ``tokenize`` reads them; raises on code it cannot read."""
    raw = list(tokenize.generate_tokens(io.StringIO(source).readline))
    starts = _offsets(source) + [len(source)]
    chosen = _assigned_attributes(raw)
    statements: list[_Statement] = []
    current: list[tuple[str, int, int]] = []
    depth, in_fstring, prev, prev_kind = 0, 0, "", -1
    for kind, text, (row, col), (end_row, end_col), _ in raw:
        a, b = starts[row - 1] + col, starts[end_row - 1] + end_col
        if kind == _FSTRING_START or in_fstring:  # one S for all of an f-string
            if kind == _FSTRING_START:
                in_fstring += 1
                if in_fstring == 1:
                    current.append(("S", a, b))
            elif kind == _FSTRING_END:
                in_fstring -= 1
            current[-1] = ("S", current[-1][1], b)
            continue
        if kind == _NAME:
            text = _as_python_reads(text)
            if text in _KEYWORDS or text in ("match", "case") and not current:
                word = text
            elif prev == "." and text not in chosen:
                word = text  # a library's attribute: .softmax, .transpose
            else:
                word = "V"
            current.append((word, a, b))
        elif kind == _NUMBER:
            current.append(("N", a, b))
        elif kind == _STRING:
            if prev_kind == _STRING and current and current[-1][0] == "S":
                current[-1] = ("S", current[-1][1], b)  # "a" "b" is one string
            else:
                current.append(("S", a, b))
        elif kind == _NEWLINE:
            if current and not all(w == "S" for w, _, _ in current):  # a docstring or a bare string: dropped
                statements.append((depth, current[0][0] in _COMPOUND or prev == ":", current))
            current = []
        elif kind == _INDENT:
            depth += 1
        elif kind == _DEDENT:
            depth -= 1
        elif kind in _SKIPPED:
            continue
        elif text.strip():
            current.append((text, a, b))
        prev = text if kind != _NEWLINE else ""
        prev_kind = kind
    if current:
        statements.append((depth, current[0][0] in _COMPOUND, current))
    return statements


_Token = tuple[str, int, int]
_OPENING, _CLOSING = frozenset("([{"), frozenset(")]}")


def _constant(source: str, statement: _Statement) -> bool | None:
    """Whether an ``if``/``elif``/``while`` statement's test is a constant that is always true or
    always false (``False``, ``0``, ``None``, ``""``, ``True``, ``1``), None when it is anything else."""
    toks = statement[2]
    if len(toks) < 3 or toks[0][0] not in ("if", "elif", "while") or toks[2][0] != ":":
        return None
    word, a, b = toks[1]
    if word in ("False", "None", "True"):
        return word == "True"
    if word in ("N", "S"):
        try:
            return bool(ast.literal_eval(source[a:b]))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
    return None


def _block(statements: list[_Statement], at: int) -> int:
    """The index after the block that the compound statement ``statements[at]`` opens."""
    end = at + 1
    while end < len(statements) and statements[end][0] > statements[at][0]:
        end += 1
    return end


def _body_of(statements: list[_Statement], at: int) -> list[_Statement]:
    """What runs when the branch ``statements[at]`` is taken, at the branch's own depth: its body
    after the colon on the same line, or its block one level out."""
    depth, _, toks = statements[at]
    colon = next(i for i, t in enumerate(toks) if t[0] == ":") if toks[0][0] != "else" else 1
    inline = toks[colon + 1:]
    if inline:
        return [(depth, inline[0][0] in _COMPOUND, inline)]
    return [(d - 1, c, t) for d, c, t in statements[at + 1:_block(statements, at)]]


def _chain_end(statements: list[_Statement], at: int) -> int:
    """The index after the ``if`` (or ``while``) at ``at`` and the ``elif``/``else`` branches it has."""
    end = _block(statements, at)
    while end < len(statements) and statements[end][0] == statements[at][0] \
            and statements[end][2][0][0] in ("elif", "else"):
        end = _block(statements, end)
    return end


def _taken(statements: list[_Statement], at: int, value: bool) -> list[_Statement]:
    """What runs of the ``if``/``while`` at ``at`` whose test is always ``value``: the first
    branch's body, or what follows it (an ``elif`` then reads as an ``if``; an ``else``'s body)."""
    if value:
        return _body_of(statements, at)
    end = _block(statements, at)
    if end == len(statements) or statements[end][0] != statements[at][0]:
        return []
    depth, compound, toks = statements[end]
    if toks[0][0] == "elif":
        return [(depth, compound, [("if", *toks[0][1:]), *toks[1:]])] + statements[end + 1:_chain_end(statements, at)]
    return _body_of(statements, end) if toks[0][0] == "else" else []


def _live(statements: list[_Statement], source: str) -> list[_Statement]:
    """The statements less the branches that can never run (``if False:``, ``if 0:``, ``while
    False:``, the ``else`` of ``if True:``); a branch that always runs is read as its body (and
    read again: it may hold dead branches of its own). ``while True:`` is a loop, and stays."""
    statements, out, i = list(statements), [], 0
    while i < len(statements):
        value = _constant(source, statements[i])
        if value is None or (value and statements[i][2][0][0] == "while"):
            out.append(statements[i])
            i += 1
        else:
            statements[i:_chain_end(statements, i)] = _taken(statements, i, value)
    return out


def _name(source: str, token: _Token) -> str:
    return _as_python_reads(source[token[1]:token[2]])


def _closing(toks: list[_Token], at: int) -> int:
    """The index of the bracket that closes the one at ``toks[at]`` (the last token if none does)."""
    level = 0
    for i in range(at, len(toks)):
        level += (toks[i][0] in _OPENING) - (toks[i][0] in _CLOSING)
        if level == 0:
            return i
    return len(toks) - 1


def _helpers(units: list[list[_Statement]], source: str) -> dict[str, list[_Statement]]:
    """The top-level functions that can be read where they are called: a plain ``def`` whose body
    ends in its only ``return EXPR``, nothing yielded; by name, the body then the return's tokens."""
    found = {}
    for unit in units:
        header, body = unit[0], unit[1:]
        toks = header[2]
        if len(toks) < 3 or toks[0][0] != "def" or toks[-1][0] != ":" or not body:
            continue
        returns = [s for s in body if s[2][0][0] == "return"]
        nested = any(t[0] in ("yield", "def", "class", "nonlocal", "global") for s in body for t in s[2])
        if nested or len(returns) != 1 or body[-1] is not returns[0] or body[-1][0] != 1 or len(body[-1][2]) < 2:
            continue
        found[_name(source, toks[1])] = body
    return found


def _inline(body: list[_Statement], helpers: dict[str, list[_Statement]], source: str,
            budget: list[int]) -> tuple[list[_Statement], set[str]]:
    """``body`` with each call of a helper (``name(...)``, not an attribute) replaced by the
    helper's returned expression, its other statements placed before the statement that calls it;
    ``budget``: inlinings left (a helper that calls itself is read a few times, not forever)."""
    out: list[_Statement] = []
    used: set[str] = set()
    todo = list(body)
    while todo:
        depth, compound, toks = todo.pop(0)
        at = next((j for j, t in enumerate(toks[:-1]) if t[0] == "V" and toks[j + 1][0] == "("
                   and (j == 0 or toks[j - 1][0] not in (".", "def")) and _name(source, t) in helpers), None)
        if at is None or budget[0] <= 0 or toks[0][0] in ("elif", "else", "except", "finally", "case"):
            out.append((depth, compound, toks))
            continue
        budget[0] -= 1
        name = _name(source, toks[at])
        helper = helpers[name]
        used.add(name)
        before = [(d - 1 + depth, c, t) for d, c, t in helper[:-1]]
        todo[:0] = before + [(depth, compound, toks[:at] + helper[-1][2][1:] + toks[_closing(toks, at + 1) + 1:])]
    return out, used


def _defined(source: str, unit: list[_Statement]) -> str | None:
    """The name a top-level ``def`` defines (None for any other statement)."""
    toks = unit[0][2]
    return _name(source, toks[1]) if toks[0][0] == "def" and len(toks) > 1 else None


def _calls(source: str, unit: list[_Statement]) -> set[str]:
    """The names called in the body of a top-level definition (``name(``, not an attribute)."""
    return {_name(source, t) for _, _, toks in unit[1:] for j, t in enumerate(toks[:-1])
            if t[0] == "V" and toks[j + 1][0] == "(" and (j == 0 or toks[j - 1][0] not in (".", "def"))}


def _inlined(statements: list[_Statement], source: str) -> list[_Statement]:
    """Helper functions defined in the answer read where the answer's other functions and classes
    call them (:func:`_inline`), their own definitions then left out: an answer split into helpers
    reads as the answer. A function called only at the top level (a test of the answer) stays."""
    units: list[list[_Statement]] = []
    for statement in statements:
        if statement[0] == 0 or not units:
            units.append([statement])
        else:
            units[-1].append(statement)
    definitions = [u[0][2][0][0] in ("def", "class", "async", "@") for u in units]
    called = set().union(*[_calls(source, u) - {_defined(source, u)} for u, d in zip(units, definitions) if d])
    helpers = {name: body for name, body in _helpers(units, source).items() if name in called}
    if not helpers:
        return statements
    budget, out, used = [64], [], set()
    for unit, definition in zip(units, definitions):
        if _defined(source, unit) in helpers or not definition:
            out.append(unit)
            continue
        body, some = _inline(unit[1:], helpers, source, budget)
        used |= some
        out.append(unit[:1] + body)
    return [s for unit in out if _defined(source, unit) not in used for s in unit]


_PLAIN = re.compile(r"""(?P<comment>\#[^\n]*)|(?P<string>[rRbBuUfF]{0,2}(?:'''[\s\S]*?'''|\"\"\"[\s\S]*?\"\"\"|'[^'\n]*'|"[^"\n]*"))
                       |(?P<number>\d[\w.]*)|(?P<name>[^\W\d]\w*)|(?P<newline>\n)
                       |(?P<op>\*\*=?|//=?|>>=?|<<=?|[-+*/%@&|^=<>!:]=|->|:=|\S)""", re.X)


def _plain_statements(source: str) -> list[_Statement]:
    """Statements of code ``tokenize`` cannot read: one a line, its depth from its indentation."""
    statements: list[_Statement] = []
    current: list[tuple[str, int, int]] = []
    widths = [0]  # the indentation of each open block
    line_start, prev = 0, ""

    def end_line(compound: bool) -> None:
        width = len(source[line_start:current[0][1]].expandtabs(4))
        while width < widths[-1]:
            widths.pop()
        if width > widths[-1]:
            widths.append(width)
        statements.append((len(widths) - 1, compound, list(current)))
    for m in _PLAIN.finditer(source):
        kind, text, a, b = m.lastgroup, m.group(), m.start(), m.end()
        if kind == "newline":
            if current:
                end_line(current[0][0] in _COMPOUND or prev == ":")
            current, line_start, prev = [], b, ""
            continue
        if kind == "comment":
            continue
        if kind == "name":
            word = text if text in _KEYWORDS or prev == "." else "V"
        else:
            word = {"string": "S", "number": "N"}.get(kind, text)
        current.append((word, a, b))
        prev = text
    if current:
        end_line(current[0][0] in _COMPOUND)
    return statements


# Control characters other than tab, newline and form feed, read as a space: Python versions
# tokenize them differently (3.11 skips a lone carriage return or a U+001C as an error token;
# 3.12's tokenizer ends a comment at the carriage return and refuses the U+001C after it), and
# the same answer must give the same tokens on every Python. One character for one: the spans
# still point into the answer as written.
_BLANKED = {c: " " for c in [*range(0x20), 0x7F] if chr(c) not in "\t\n\x0c"}
_LONE_CR = re.compile(r"\r(?!\n)")


def code_tokens(source: str) -> Tokens:
    """A code answer's normalised tokens (see the module's description)."""
    cut = len(source) > MAX_CHARS
    source = source[:MAX_CHARS]
    # line endings as Python reads them: a lone carriage return ends a line (behind a comment it
    # would otherwise hide the rest of the answer); one character for one
    readable = _LONE_CR.sub("\n", source.replace("\r\n", " \n")).translate(_BLANKED)
    try:
        statements = _python_statements(readable)
    except (tokenize.TokenError, SyntaxError, ValueError):  # IndentationError is a SyntaxError
        statements = _plain_statements(readable)
    words, spans = _canonical(_inlined(_live(statements, readable), readable))
    return Tokens(source, words, spans, cut)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n\s*\n|\n(?=\s*(?:[-*+]|\d+\.)\s)")
_WORD = re.compile(r"[^\W_]+(?:_[^\W_]+)*")


def text_tokens(source: str) -> Tokens:
    """A written answer's words, lower-case, its sentences in canonical order."""
    cut = len(source) > MAX_CHARS
    source = source[:MAX_CHARS]
    statements: list[_Statement] = []
    start = 0
    for end in [m.start() for m in _SENTENCE_END.finditer(source)] + [len(source)]:
        words = [(m.group().lower(), start + m.start(), start + m.end()) for m in _WORD.finditer(source[start:end])]
        if words:
            statements.append((0, False, words))
        start = end
    words, spans = _canonical(statements)
    keep = [i for i, w in enumerate(words) if w != ";"]  # a sentence is no token of its own
    return Tokens(source, [words[i] for i in keep], [spans[i] for i in keep], cut)
