"""Malformed DSL programs: each gives one located, readable diagnostic (file:line:col, the source
line with a caret under the culprit, and a suggestion), never a traceback."""
from __future__ import annotations

import pytest

from kumiko.cli import main as cli
from kumiko.diagnostics import KumikoError
from kumiko.frontend.dsl import parse_program

HEAD = "graph<N=4> main(x: f32[N]) -> (y: f32[N]) {\n"

#: (id, program, code, line, col, words the message must contain)
CASES = [
    ("missing_return", HEAD + "    y = relu(x)\n}\n", "E1601", 3, 1, "no return statement"),
    ("unknown_op", HEAD + "    y = rleu(x)\n    return y\n}\n", "E1601", 2, 9, "did you mean 'relu'"),
    ("unknown_variable", "graph<N=4> main(x: f32[N], bias: f32[N]) -> (y: f32[N]) {\n    y = x + bais\n"
     "    return y\n}\n", "E1601", 2, 13, "did you mean 'bias'"),
    ("bad_dtype", "graph<N=4> main(x: f8[N]) -> (y: f32[N]) {\n    y = relu(x)\n    return y\n}\n",
     "E1601", 1, 20, "unknown dtype 'f8'"),
    ("f8_dtype", "graph main(x: f8[2]) -> (y: f32[2]) {\n    return x\n}\n", "E1601", 1, 15, "unknown dtype"),
    ("unbalanced_paren", HEAD + "    y = relu((x + 1.0)\n    return y\n}\n", "E1601", 2, 13, "never closed"),
    ("extra_paren", HEAD + "    y = relu(x))\n    return y\n}\n", "E1601", 2, 16, "unmatched ')'"),
    ("reserved_word", HEAD + "    fused = relu(x)\n    return fused\n}\n", "E1601", 2, 5, "reserved word"),
    ("reserved_graph_name", "graph return(x: f32[2]) -> (y: f32[2]) {\n    return x\n}\n", "E1601", 1, 7,
     "reserved word"),
    ("recursion_too_deep", "graph<N=1> f(x: f32[N]) -> (y: f32[N]) {\n    y = f(x)\n    return y\n}\n" + HEAD +
     "    y = f(x)\n    return y\n}\n", "E1601", 2, 9, "deeper than 10"),
    ("wrong_op_arg_count", HEAD + "    y = relu(x, x)\n    return y\n}\n", "E1601", 2, 9, "relu takes 1 input, got 2"),
    ("wrong_graph_arg_count", "graph<N=1> g(x: f32[N]) -> (y: f32[N]) {\n    return x\n}\n" + HEAD +
     "    y = g(x, x)\n    return y\n}\n", "E1601", 5, 9, "takes 1 input(s) (x), got 2"),
    ("shape_mismatch_at_statement", "graph<M=4, N=3, K=5> main(A: f32[M, K], B: f32[N, K]) -> (C: f32[M, N]) {\n"
     "    T = relu(A)\n    C = T @ B\n    return C\n}\n", "E1011", 3, 11, "contraction sizes differ"),
    ("broadcast_mismatch_in_subgraph", "graph<N=1, M=1> g(x: f32[N], b: f32[M]) -> (y: f32[N]) {\n"
     "    y = x * b\n    return y\n}\ngraph<N=4, M=3> main(x: f32[N], b: f32[M]) -> (y: f32[N]) {\n"
     "    y = g(x, b)\n    return y\n}\n", "E1001", 2, 11, "cannot broadcast"),
    ("subgraph_argument_type", "graph<N=1> g(x: f32[N], b: f32[N]) -> (y: f32[N]) {\n    y = x + b\n    return y\n"
     "}\ngraph<N=4, M=3> main(x: f32[N], b: f32[M]) -> (y: f32[N]) {\n    y = g(x, b)\n    return y\n}\n",
     "E1011", 6, 14, "must be f32[N], got f32[M]"),
    ("declared_output_type", HEAD.replace("(y: f32[N])", "(y: f16[N])") + "    y = relu(x)\n    return y\n}\n",
     "E1011", 3, 12, "declared f16[N]"),
    ("unterminated_graph", HEAD + "    y = relu(x)\n    return y\n", "E1601", 1, 43, "unterminated graph body"),
    ("unterminated_string", HEAD + '    y = gelu(x, approximate="tanh)\n    return y\n}\n', "E1601", 2, 29,
     "unterminated string"),
    ("stray_character", HEAD + "    y = relu(x) $ 2\n    return y\n}\n", "E1601", 2, 17, "unexpected character"),
    ("redefinition", HEAD + "    y = relu(x)\n    y = exp(y)\n    return y\n}\n", "E1601", 3, 5, "already defined"),
    ("no_main", "graph<N=1> f(x: f32[N]) -> (y: f32[N]) {\n    y = relu(x)\n    return y\n}\n", "E1601", 1, 12,
     "no graph main"),
    ("undeclared_size", "graph main(x: f32[N]) -> (y: f32[N]) {\n    y = relu(x)\n    return y\n}\n", "E1601", 1, 19,
     "unknown size 'N'"),
    ("statement_after_return", HEAD + "    y = relu(x)\n    return y\n    z = y\n}\n", "E1601", 4, 5,
     "unreachable"),
    ("unassigned_call", HEAD + "    relu(x)\n    return x\n}\n", "E1601", 2, 5, "not assigned"),
    ("misspelt_attribute", "graph<N=4, M=3> main(x: f32[N, M]) -> (y: f32[N, 1]) {\n"
     "    y = sum(x, axes=[1], keepdims=true)\n    return y\n}\n", "E1601", 2, 26, "did you mean 'keepdim'"),
    ("tensor_as_attribute", "graph main(x: f32[1, 1, 4, 4], w: f32[1, 1, 3, 3], b: f32[1]) -> (y: f32[1, 1, 2, 2]) {\n"
     "    y = conv2d(x, w, bias=b)\n    return y\n}\n", "E1601", 2, 27, "'b' is a tensor"),
    ("size_as_value", HEAD + "    y = x * N\n    return y\n}\n", "E1601", 2, 13, "'N' is a size"),
    ("wrong_return_count", HEAD + "    y = relu(x)\n    return y, x\n}\n", "E1601", 3, 5, "returns 2 value(s)"),
    ("output_is_an_input", HEAD + "    return x\n}\n", "E1601", 2, 12, "would be the input 'x' itself"),
    ("destructure_count", "graph<N=1> two(x: f32[N]) -> (a: f32[N], b: f32[N]) {\n    return x, x\n}\n" + HEAD +
     "    y = two(x)\n    return y\n}\n", "E1601", 5, 9, "returns 2 value(s) but 1 name(s)"),
    ("fused_syntax", HEAD + "    y = fused(x)\n    return y\n}\n", "E1601", 2, 9, "fused-op syntax"),
    ("duplicate_graph", HEAD + "    y = relu(x)\n    return y\n}\n" + HEAD + "    y = relu(x)\n    return y\n}\n",
     "E1601", 5, 12, "defined twice"),
    ("qualifier_on_output", "graph main(x: f32[2]) -> (y: param f32[2]) {\n    y = relu(x)\n    return y\n}\n",
     "E1601", 1, 30, "outputs take no qualifiers"),
    ("bad_size_default", "graph<N=x> main(x: f32[N]) -> (y: f32[N]) {\n    y = relu(x)\n    return y\n}\n",
     "E1601", 1, 9, "non-negative integer"),
    ("lowering_attribute_error", HEAD + "    y = softmax(x, axis=3)\n    return y\n}\n", "E1010", 2, 9,
     "out of range"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_program_gives_a_located_error(case):
    _, text, code, line, col, words = case
    with pytest.raises(KumikoError) as info:
        parse_program(text, filename="bad.kumiko")
    e = info.value
    assert e.code == code, e.render()
    assert e.at == f"bad.kumiko:{line}:{col}", e.render()
    assert words in e.why, e.render()
    assert e.suggestion, e.render()
    # the excerpt shows the offending line and puts the caret under the reported column
    excerpt = e.details["excerpt"].split("\n")
    assert excerpt[0].startswith(f"{line:>5} | ") and excerpt[0].endswith(text.split("\n")[line - 1].rstrip())
    caret = excerpt[1]
    assert caret.index("^") - caret.index("|") - 2 == col - 1, e.render()
    # rendered, it is a readable block: head line with the location, the excerpt, the suggestion
    r = e.render()
    assert r.startswith(f"error[{code} ") and f"bad.kumiko:{line}:{col}" in r and "suggestion:" in r


def test_cli_prints_the_diagnostic_and_exits_2(tmp_path, capsys):
    p = tmp_path / "bad.kumiko"
    p.write_text(HEAD + "    y = rleu(x)\n    return y\n}\n")
    assert cli(["run", str(p)]) == 2
    err = capsys.readouterr().err
    assert f"{p}:2:9" in err and "    y = rleu(x)" in err and "^^^^" in err and "Traceback" not in err
    assert cli(["check", str(p), "--json"]) == 2
    assert '"code": "E1601"' in capsys.readouterr().out


def test_errors_inside_subgraphs_name_the_call_chain():
    text = ("graph<N=1> inner(x: f32[N]) -> (y: f32[N]) {\n    y = relu(x, x)\n    return y\n}\n"
            "graph<N=1> outer(x: f32[N]) -> (y: f32[N]) {\n    y = inner(x)\n    return y\n}\n"
            + HEAD + "    y = outer(x)\n    return y\n}\n")
    with pytest.raises(KumikoError) as info:
        parse_program(text, filename="m.kumiko")
    chain = info.value.details["called_from"]
    assert chain == "inner called at m.kumiko:6:9 in outer; outer called at m.kumiko:10:9 in main"


def test_tabs_keep_the_caret_aligned():
    text = "graph main(x: f32[2]) -> (y: f32[2]) {\n\ty = x +\tbogus\n\treturn y\n}\n"
    with pytest.raises(KumikoError) as info:
        parse_program(text)
    line, caret = info.value.details["excerpt"].split("\n")
    assert caret.endswith("\t" + " " * 7 + "\t^^^^^")     # tabs copied, so the caret sits under 'bogus'
