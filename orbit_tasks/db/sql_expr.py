"""Canonical form of the SQL expressions in CHECK constraints, and the named constraints of a
``CREATE TABLE`` statement (pure: text in, values out).

Servers do not report a CHECK clause as it was written: MariaDB prints it lower-cased with
back-quoted names and minimal parentheses (`` `a` > 0 and `b` in ('x') ``), MySQL 8 adds a
parenthesis around every operation, charset introducers (``_utf8mb4'x'``) and, in
``information_schema``, backslash-escaped quotes; both turn ``TIMESTAMPADD(HOUR,24,x)`` into
``x + interval 24 hour``. :func:`canonical` parses such a clause (a small precedence parser for
the operators CHECK constraints use) and prints one fully parenthesised form, so two clauses
compare equal exactly when they parse to the same tree. AND/OR chains are flattened (they are
associative); nothing else is reordered. See docs/schema.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+|--[^\n]*|/\*.*?\*/)
  | (?P<str>'(?:[^'\\]|\\.|'')*')
  | (?P<bq>`(?:[^`]|``)*`)
  | (?P<dq>"(?:[^"]|"")*")
  | (?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)
  | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
  | (?P<op><=>|<>|!=|<=|>=|\|\||&&|[=<>+\-*/%(),.!;])
    """,
    re.VERBOSE,
)
_COMPARISON = {"=": "=", "<>": "<>", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_COMPARISON["<=>"] = "<=>"
_UNITS = {"microsecond", "second", "minute", "hour", "day", "week", "month", "quarter", "year"}


class SqlSyntaxError(ValueError):
    """The text is not an expression this parser understands."""


@dataclass(frozen=True)
class Token:
    kind: str  # str, name, num, op, word
    text: str


def tokenize(sql: str) -> list[Token]:
    """Tokens of ``sql``; quoted names become ``name`` tokens, charset introducers are dropped."""
    out: list[Token] = []
    pos = 0
    while pos < len(sql):
        m = _TOKEN.match(sql, pos)
        if m is None:
            raise SqlSyntaxError(f"unexpected character {sql[pos]!r} at {pos}")
        pos = m.end()
        kind = m.lastgroup
        raw = m.group()
        if kind == "ws":
            continue
        if kind == "str":
            if out and out[-1].kind == "word" and re.fullmatch(r"_\w+|[nN]", out[-1].text):
                out.pop()  # _utf8mb4'x' / N'x': the introducer names a charset, not a value
            out.append(Token("str", _unquote_string(raw)))
        elif kind == "bq":
            out.append(Token("name", raw[1:-1].replace("``", "`").lower()))
        elif kind == "dq":
            out.append(Token("name", raw[1:-1].replace('""', '"').lower()))
        elif kind == "word":
            out.append(Token("word", raw.lower()))
        else:
            out.append(Token(str(kind), raw))
    return out


def _unquote_string(raw: str) -> str:
    body = raw[1:-1].replace("''", "'")
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "0": "\0"}.get(m[1], m[1]), body)


def unescape_mysql_clause(clause: str) -> str:
    """MySQL 8's ``information_schema.CHECK_CONSTRAINTS`` escapes the clause once more than
    ``SHOW CREATE TABLE`` does (``_utf8mb4\\'x\\'``); undo that one level."""
    return re.sub(r"\\(.)", r"\1", clause)


Node = tuple[Any, ...]  # ("op", operand, ...) trees; printed by _render


class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.pos = 0

    # -- token helpers -------------------------------------------------------------------------
    def peek(self, offset: int = 0) -> Token | None:
        i = self.pos + offset
        return self.tokens[i] if i < len(self.tokens) else None

    def at_word(self, *words: str, offset: int = 0) -> bool:
        tok = self.peek(offset)
        return tok is not None and tok.kind == "word" and tok.text in words

    def at_op(self, *ops: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind == "op" and tok.text in ops

    def take(self) -> Token:
        tok = self.peek()
        if tok is None:
            raise SqlSyntaxError("unexpected end of expression")
        self.pos += 1
        return tok

    def expect_op(self, op: str) -> None:
        tok = self.take()
        if tok.kind != "op" or tok.text != op:
            raise SqlSyntaxError(f"expected {op!r}, found {tok.text!r}")

    def expect_word(self, word: str) -> None:
        tok = self.take()
        if tok.kind != "word" or tok.text != word:
            raise SqlSyntaxError(f"expected {word!r}, found {tok.text!r}")

    # -- grammar (lowest precedence first) -----------------------------------------------------
    def expression(self) -> Node:
        parts = [self.conjunction()]
        while self.at_word("or") or self.at_op("||"):
            self.take()
            parts.append(self.conjunction())
        return _chain("or", parts)

    def conjunction(self) -> Node:
        parts = [self.negation()]
        while self.at_word("and") or self.at_op("&&"):
            self.take()
            parts.append(self.negation())
        return _chain("and", parts)

    def negation(self) -> Node:
        if self.at_word("not") or self.at_op("!"):
            self.take()
            return ("not", self.negation())
        return self.predicate()

    def predicate(self) -> Node:
        left = self.additive()
        while True:
            tok = self.peek()
            if tok is not None and tok.kind == "op" and tok.text in _COMPARISON:
                self.take()
                left = (_COMPARISON[tok.text], left, self.additive())
                continue
            if self.at_word("is"):
                self.take()
                negated = self.at_word("not")
                if negated:
                    self.take()
                self.expect_word("null")
                left = ("is not null" if negated else "is null", left)
                continue
            negated = self.at_word("not") and self.at_word("in", "between", "like", offset=1)
            if negated:
                self.take()
            prefix = "not " if negated else ""
            if self.at_word("in"):
                self.take()
                self.expect_op("(")
                left = (prefix + "in", left, ("list", *self.list_items()))
            elif self.at_word("between"):
                self.take()
                low = self.additive()
                self.expect_word("and")
                left = (prefix + "between", left, low, self.additive())
            elif self.at_word("like"):
                self.take()
                left = (prefix + "like", left, self.additive())
            else:
                return left

    def list_items(self) -> list[Node]:
        items = [self.expression()]
        while self.at_op(","):
            self.take()
            items.append(self.expression())
        self.expect_op(")")
        return items

    def additive(self) -> Node:
        left = self.multiplicative()
        while self.at_op("+", "-"):
            op = self.take().text
            if self.at_word("interval"):
                amount, unit = self.interval()
                left = ("date_add", left, amount if op == "+" else ("neg", amount), unit)
            else:
                left = (op, left, self.multiplicative())
        return left

    def multiplicative(self) -> Node:
        left = self.unary()
        while self.at_op("*", "/", "%") or self.at_word("div", "mod"):
            op = self.take().text
            left = ("%" if op == "mod" else op, left, self.unary())
        return left

    def unary(self) -> Node:
        if self.at_op("-"):
            self.take()
            return ("neg", self.unary())
        if self.at_op("+"):
            self.take()
            return self.unary()
        return self.primary()

    def interval(self) -> tuple[Node, str]:
        self.expect_word("interval")
        amount = self.additive()
        return amount, _unit(self.take().text)

    def primary(self) -> Node:
        tok = self.take()
        if tok.kind == "op" and tok.text == "(":
            inner = self.expression()
            self.expect_op(")")
            return inner
        if tok.kind == "str":
            return ("str", tok.text)
        if tok.kind == "num":
            return ("num", str(int(tok.text)) if tok.text.isdigit() else tok.text.lower())
        if tok.kind == "word" and tok.text in ("null", "true", "false"):
            return {"null": ("null",), "true": ("num", "1"), "false": ("num", "0")}[tok.text]
        if tok.kind == "word" and tok.text == "interval":
            self.pos -= 1
            amount, unit = self.interval()
            self.expect_op("+")
            return ("date_add", self.multiplicative(), amount, unit)
        if tok.kind == "word" and self.at_op("("):
            self.take()
            return self.call(tok.text)
        if tok.kind in ("word", "name"):
            name = tok.text
            while self.at_op("."):  # table.column: the qualifier is noise inside a CHECK
                self.take()
                name = self.take().text
            return ("col", name)
        raise SqlSyntaxError(f"unexpected {tok.text!r}")

    def call(self, fn: str) -> Node:
        if self.at_op(")"):
            self.take()
            return ("call", fn)
        if fn == "timestampadd":
            unit = _unit(self.take().text)
            self.expect_op(",")
            amount = self.expression()
            self.expect_op(",")
            base = self.expression()
            self.expect_op(")")
            return ("date_add", base, amount, unit)
        start = self.pos
        base = self.expression()
        if fn in ("date_add", "adddate") and self.at_op(",") and self.at_word("interval", offset=1):
            self.take()
            amount, unit = self.interval()
            self.expect_op(")")
            return ("date_add", base, amount, unit)
        self.pos = start
        return ("call", fn, *self.list_items())


def _unit(word: str) -> str:
    unit = word.lower()
    if unit not in _UNITS:
        raise SqlSyntaxError(f"unknown interval unit {word!r}")
    return unit


def _chain(op: str, parts: list[Node]) -> Node:
    if len(parts) == 1:
        return parts[0]
    flat: list[Node] = []
    for part in parts:  # (a AND b) AND c == a AND (b AND c): one n-ary node
        flat.extend(part[1:] if part[0] == op else [part])
    return (op, *flat)


def _render(node: Node) -> str:
    kind = node[0]
    if kind == "col":
        return str(node[1])
    if kind == "num":
        return str(node[1])
    if kind == "str":
        return "'" + str(node[1]).replace("'", "''") + "'"
    if kind == "null":
        return "null"
    if kind in ("and", "or"):
        return "(" + f" {kind} ".join(_render(n) for n in node[1:]) + ")"
    if kind == "not":
        return f"(not {_render(node[1])})"
    if kind == "neg":
        return f"(- {_render(node[1])})"
    if kind in ("is null", "is not null"):
        return f"({_render(node[1])} {kind})"
    if kind in ("in", "not in"):
        return f"({_render(node[1])} {kind} {_render(node[2])})"
    if kind == "list":
        return "(" + ", ".join(_render(n) for n in node[1:]) + ")"
    if kind in ("between", "not between"):
        return f"({_render(node[1])} {kind} {_render(node[2])} and {_render(node[3])})"
    if kind == "date_add":
        return f"date_add({_render(node[1])}, interval {_render(node[2])} {node[3]})"
    if kind == "call":
        return f"{node[1]}(" + ", ".join(_render(n) for n in node[2:]) + ")"
    return f"({_render(node[1])} {kind} {_render(node[2])})"  # binary operators


def canonical(clause: str) -> str:
    """One printed form of the expression ``clause`` (raises :class:`SqlSyntaxError`)."""
    parser = _Parser(tokenize(clause))
    tree = parser.expression()
    rest = parser.peek()
    if rest is not None:
        raise SqlSyntaxError(f"unexpected {rest.text!r} after the expression")
    return _render(tree)


def comparable(clause: str) -> str:
    """:func:`canonical`, or the token texts joined when the parser does not know the syntax
    (then only the same spelling compares equal)."""
    try:
        return canonical(clause)
    except SqlSyntaxError:
        try:
            return " ".join(t.text for t in tokenize(clause))
        except SqlSyntaxError:
            return clause


@dataclass(frozen=True)
class TableConstraints:
    """Named CHECK and UNIQUE constraints written in a ``CREATE TABLE`` statement."""

    checks: dict[str, str]  # name -> clause text ("" names an unnamed one by position)
    uniques: dict[str, tuple[str, ...]]  # name -> columns


def constraints_of_create_table(sql: str) -> TableConstraints:
    """The table-level ``[CONSTRAINT name] CHECK (...)`` and ``CONSTRAINT name UNIQUE (...)``
    clauses of ``sql`` (what SQLite keeps only as text, and what a compiled DDL states)."""
    tokens = tokenize(sql)
    checks: dict[str, str] = {}
    uniques: dict[str, tuple[str, ...]] = {}
    i = 0
    unnamed = 0
    while i < len(tokens):
        tok = tokens[i]
        name = None
        if tok.kind == "word" and tok.text == "constraint" and i + 2 < len(tokens):
            name = tokens[i + 1].text
            i += 2
            tok = tokens[i]
        if tok.kind == "word" and tok.text == "check" and _is_open(tokens, i + 1):
            end = _matching(tokens, i + 1)
            if name is None:
                unnamed += 1
                name = f"#{unnamed}"
            checks[name] = _join(tokens[i + 2 : end])
            i = end + 1
            continue
        if name is not None and tok.kind == "word" and tok.text == "unique":
            j = i + 1 + (tokens[i + 1].text == "key")
            if _is_open(tokens, j):
                end = _matching(tokens, j)
                uniques[name] = tuple(t.text for t in tokens[j + 1 : end] if t.text != ",")
                i = end + 1
                continue
        i += 1
    return TableConstraints(checks, uniques)


def _is_open(tokens: list[Token], i: int) -> bool:
    return i < len(tokens) and tokens[i].kind == "op" and tokens[i].text == "("


def _matching(tokens: list[Token], open_at: int) -> int:
    depth = 0
    for j in range(open_at, len(tokens)):
        if tokens[j].kind == "op" and tokens[j].text == "(":
            depth += 1
        elif tokens[j].kind == "op" and tokens[j].text == ")":
            depth -= 1
            if depth == 0:
                return j
    raise SqlSyntaxError("unbalanced parentheses")


def _join(tokens: list[Token]) -> str:
    parts = []
    for tok in tokens:
        if tok.kind == "str":
            parts.append("'" + tok.text.replace("'", "''") + "'")
        elif tok.kind == "name":
            parts.append(f"`{tok.text}`")
        else:
            parts.append(tok.text)
    return " ".join(parts)
