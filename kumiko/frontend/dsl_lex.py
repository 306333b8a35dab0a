"""The DSL's source text: ``Source`` (the text and its file name, which makes the located diagnostics:
``file:line:col``, the source line and a caret under the culprit), ``tokenize`` (text -> ``Token``s,
brackets matched, number literals checked against int64/float64) and ``closest_match`` (the "did you
mean" of misspelt names). The parser (``dsl``) reads the tokens.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from kumiko.diagnostics import KumikoError
from kumiko.frontend.dsl_ast import Pos

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
INT64_MAX = 2 ** 63 - 1


class Source:
    """The program text and its file name; makes located diagnostics."""

    def __init__(self, text: str, filename: str | None = None):
        self.text = text
        self.filename = filename or "<string>"
        self.lines = text.split("\n")

    def where(self, pos: Pos) -> str:
        return f"{self.filename}:{pos.line}:{pos.col}"

    def excerpt(self, pos: Pos) -> str:
        line = self.lines[pos.line - 1] if 0 < pos.line <= len(self.lines) else ""
        gutter = f"{pos.line:>5} | "
        lead = "".join(c if c == "\t" else " " for c in line[:pos.col - 1])
        width = max(1, min(pos.width, max(1, len(line) - pos.col + 1)))
        return f"{gutter}{line.rstrip()}\n{' ' * (len(gutter) - 2)}| {lead}{'^' * width}"

    def error(self, pos: Pos, why: str, suggestion: str | None = None, code: str = "E1601",
              **details: Any) -> KumikoError:
        return KumikoError(code, at=self.where(pos), why=why, suggestion=suggestion, **details,
                           excerpt=self.excerpt(pos))


@dataclass(frozen=True)
class Token:
    kind: str          # ident, name (backticked), num, str, op, nl, eof
    text: str
    value: Any
    pos: Pos


_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r\f]+)
  | (?P<comment>//[^\n]*)
  | (?P<nl>\n)
  | (?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<name>`[^`\n]+`)
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<op>->|\*\*|<=|>=|==|!=|[-+*/@%<>=,:;()\[\]{}])
""", re.X)


_CLOSE = {")": "(", "]": "[", "}": "{"}


def tokenize(src: Source) -> list[Token]:
    """Tokens with positions. Newlines end statements only outside ( ) and [ ]; brackets must match."""
    text, out, pos, line, line_start = src.text, [], 0, 1, 0
    stack: list[Token] = []
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        col = pos - line_start + 1
        if m is None:
            ch = text[pos]
            if ch in "\"`":
                what = "string" if ch == '"' else "quoted name"
                raise src.error(Pos(line, col), f"unterminated {what}: the closing {ch} is missing on this line",
                                suggestion=f"close the {what} with {ch} before the end of the line")
            raise src.error(Pos(line, col), f"unexpected character {ch!r}",
                            suggestion="Names are letters, digits and '_'; operators are + - * / ** @ and "
                            "comparisons; comments start with //.")
        kind, s = m.lastgroup, m.group()
        p = Pos(line, col, len(s))
        if kind == "nl":
            if not stack or stack[-1].text == "{":
                out.append(Token("nl", s, None, p))
            line, line_start = line + 1, m.end()
        elif kind == "num":
            out.append(Token(kind, s, _number(src, s, p), p))
        elif kind == "str":
            out.append(Token(kind, s, json.loads(s), p))
        elif kind == "name":
            out.append(Token(kind, s, s[1:-1], p))
        elif kind in ("ident", "op"):
            tok = Token(kind, s, s, p)
            if s in "([{" and kind == "op":
                stack.append(tok)
            elif s in _CLOSE and kind == "op":
                if all(o.text != _CLOSE[s] for o in stack):
                    raise src.error(p, f"unmatched {s!r}: no {_CLOSE[s]!r} is open here",
                                    suggestion=f"remove this {s!r} or add the matching {_CLOSE[s]!r} before it")
                if stack[-1].text != _CLOSE[s]:
                    raise _unclosed(src, stack[-1], found=tok)
                stack.pop()
            out.append(tok)
        pos = m.end()
    if stack:
        raise _unclosed(src, stack[-1])
    end = Pos(line, pos - line_start + 1)
    out.append(Token("nl", "", None, end))
    out.append(Token("eof", "", None, end))
    return out


def _number(src: Source, s: str, pos: Pos) -> int | float:
    """A number literal's value. An integer must fit int64 (kumiko's integers are i32; int64 is
    where constants fold) and is checked by its length before Python converts it, so a 5000-digit
    literal is a diagnostic rather than Python's int-string limit; a float that overflows float64
    would silently be inf."""
    if not any(c in s for c in ".eE"):
        if len(s.lstrip("0")) > 19 or int(s) > INT64_MAX:
            raise src.error(pos, f"the integer {s[:20]}{'...' if len(s) > 20 else ''} ({len(s)} digits) is "
                            "outside the int64 range", suggestion="write it as a float, e.g. 1e30, if you mean "
                            "a float")
        return int(s)
    v = float(s)
    if math.isinf(v):
        raise src.error(pos, f"the number {s[:20]}{'...' if len(s) > 20 else ''} is outside the float64 range",
                        suggestion="write inf if you mean infinity")
    return v


def _unclosed(src: Source, opener: Token, found: Token | None = None) -> KumikoError:
    close = {v: k for k, v in _CLOSE.items()}[opener.text]
    seen = f" (found {found.text!r} at {found.pos.line}:{found.pos.col})" if found else " before the end of the file"
    if opener.text == "{":
        return src.error(opener.pos, f"unterminated graph body: this '{{' is never closed{seen}",
                         suggestion="end the graph with '}' after its return statement")
    return src.error(opener.pos, f"this {opener.text!r} is never closed{seen}",
                     suggestion=f"add the missing {close!r}")


def closest_match(word: str, options: list[str]) -> str | None:
    import difflib
    hits = difflib.get_close_matches(word, sorted(set(options)), n=1, cutoff=0.6)
    return hits[0] if hits else None
