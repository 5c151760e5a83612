"""Trimming (gemmgen.codegen.trim): a decided `if constexpr` keeps its live branch, one it cannot
decide stays whole, a definition nothing names goes and one that is named stays; the tokens of an
edited text are those a fresh scan finds; and (nvcc, in the slow run: two builds of a Hopper file)
a trimmed file compiles to the same cubin as the untrimmed one."""

import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import build_once

from gemmgen.build.nvcc import build_library
from gemmgen.codegen.render import render_kernel
from gemmgen.codegen.trim import _trim, cxx, trim, unreachable, unused
from gemmgen.describe.points import resolve_point

BRANCHES = """\
constexpr bool GG_SLOW = false;
constexpr int GG_WAYS = 4;

__device__ int fast(int x);
__device__ int slow(int x);

extern "C" __global__ void k(int* out, int x)
{
    if constexpr (GG_SLOW) {
        out[0] = slow(x);
    } else if constexpr (GG_WAYS > 2) {
        // more than two ways
        out[0] = fast(x);
        out[1] = fast(x + 1);
    } else {
        out[0] = 0;
    }
    if constexpr (GG_WAYS % 2 == 1)
        out[2] = 1;
}
"""


def test_a_decided_branch_leaves_its_live_code_in_place():
    trimmed = trim(BRANCHES)
    assert "if constexpr" not in trimmed
    assert ("{\n    // more than two ways\n    out[0] = fast(x);\n    out[1] = fast(x + 1);\n}\n") in trimmed
    assert "slow" not in trimmed and "out[2]" not in trimmed and "out[0] = 0;" not in trimmed
    assert "__device__ int fast(int x);" in trimmed  # named by the live branch: kept
    assert "GG_SLOW" not in trimmed and "GG_WAYS" not in trimmed  # the constants went with their conditions


def test_a_branch_that_declares_stays_a_block_unless_it_ends_the_block():
    source = """\
constexpr bool GG_ON = true;
__device__ void f(int* out)
{
    if constexpr (GG_ON) {
        const int x = 1;
        out[0] = x;
    }
    const int x = 2;
    out[1] = x;
}
__device__ void g(int* out)
{
    out[1] = 2;
    if constexpr (GG_ON) {
        const int y = 1;
        out[0] = y;
    }
}
"""
    trimmed = trim(source)
    # f: x would clash with the x after it, so the branch stays a block; g: it ends g's body
    assert "{\n    {\n        const int x = 1;\n        out[0] = x;\n    }\n    const int x = 2;" in trimmed
    assert "    out[1] = 2;\n    const int y = 1;\n    out[0] = y;\n}" in trimmed


def test_a_condition_it_cannot_decide_is_left_whole():
    source = """\
constexpr bool GG_ON = true;
template <int N, typename T>
__device__ void f(T* out)
{
    if constexpr (N > 1) {
        out[0] = 1;
    }
    if constexpr (sizeof(T) == 2) {
        out[1] = 2;
    }
}
__device__ void g(int* out, bool GG_ON)
{
    if constexpr (GG_ON) {
        out[0] = 3;
    }
}
extern "C" __global__ void k(int* out) { f<2>(out); g(out, false); }
"""
    trimmed = trim(source)
    assert "if constexpr (N > 1) {" in trimmed and "if constexpr (sizeof(T) == 2) {" in trimmed
    # g's parameter hides the constant (the code would not compile; the trimmer does not guess)
    assert "if constexpr (GG_ON) {\n        out[0] = 3;" in trimmed


def test_a_dead_branch_a_lambda_captures_through_stays():
    """[&] captures what its body names, discarded statements included: removing the only mention
    of `pending` would change the closure, and can change the compiler's output."""
    source = """\
constexpr bool GG_HOLD = false;
extern "C" __global__ void k(int* out)
{
    int pending = -1, last = 0;
    auto step = [&](int i) {
        if constexpr (GG_HOLD) {
            pending = i;
        }
        last = i;
    };
    auto other = [&](int i) {
        if constexpr (GG_HOLD) {
            last = i + 1;
        }
        last = i;
    };
    step(1);
    other(2);
    out[0] = last + pending;
}
"""
    trimmed = trim(source)
    assert "if constexpr (GG_HOLD) {\n            pending = i;" in trimmed  # step names pending only there
    assert "last = i + 1;" not in trimmed  # other names last elsewhere too: its dead branch goes


def test_a_plain_if_goes_where_a_constant_operand_decides_it():
    """`GG_SPLIT && k < n` is false whatever `k < n` is (which reads as a template to the
    evaluator); C++ never evaluates it, and the compiler drops the branch as it drops an `if
    constexpr` one. `f(k) && GG_SPLIT` calls f first: it stays."""
    source = """\
constexpr bool GG_SPLIT = false;
__device__ int f(int x);
extern "C" __global__ void k(int* out, int k, int n)
{
    if (GG_SPLIT && k < n) {
        out[1] = k;
    }
    if (!GG_SPLIT || k < n)
        out[0] = n;
    if (k < n)
        out[2] = 2;
    if (f(k) && GG_SPLIT)
        out[3] = 3;
}
"""
    trimmed = trim(source)
    assert "out[1]" not in trimmed
    assert "{\n    out[0] = n;\n    if (k < n)\n        out[2] = 2;\n    if (f(k) && GG_SPLIT)\n        out[3] = 3;\n}" in trimmed


def test_a_decided_conditional_folds_only_where_its_type_cannot_matter():
    source = """\
constexpr bool GG_KC = true;
__device__ int f(int x);
__device__ float g(float x);
extern "C" __global__ void k(int* out, float* fout, int m, int kk)
{
    const int gr = GG_KC ? m + 1 : kk + 1, gc = GG_KC ? kk : m;
    auto a = GG_KC ? 1 : 2.5f;
    const int& r = GG_KC ? out[0] : out[1];
    out[3] = f(GG_KC ? m : kk);
    fout[0] = g(a) + (float)r;
    out[1] = out[GG_KC ? 2 : 1] + gr + gc;
    out[2] = (GG_KC ? m : kk < m) && kk > 0;
    auto frag = [&](int s) -> unsigned { return GG_KC ? s * 2u : f(s); };
    auto pick = [&](int s) { return GG_KC ? s : 1.5f; };
    out[4] = frag(m) + pick(kk);
}
"""
    trimmed = trim(source)
    assert "const int gr = m + 1, gc = kk;" in trimmed  # declared with a type: converted to it either way
    assert "auto a = GG_KC ? 1 : 2.5f;" in trimmed  # a float: `1` alone would make it an int
    assert "const int& r = GG_KC ? out[0] : out[1];" in trimmed  # a reference binds to the operand itself
    assert "f(GG_KC ? m : kk)" in trimmed  # an argument: which overload is called may follow the type
    assert "out[1] = out[2] + gr + gc;" in trimmed  # two int literals: one type
    assert "out[2] = m && kk > 0;" in trimmed  # tested as bool; the parentheses only grouped it
    assert "return s * 2u;" in trimmed  # the lambda says what it returns
    assert "return GG_KC ? s : 1.5f;" in trimmed  # it does not: its return type is the expression's


def test_a_conditional_whose_operands_hold_commas_and_templates_folds_whole():
    source = """\
constexpr bool GG_SWAP = false, GG_KC = true;
template <int A, bool B> __device__ unsigned swz(int r, int c);
extern "C" __global__ void k(unsigned* out, int lane)
{
    const unsigned frag = GG_SWAP ? swz<4, false>(lane % 8, lane / 8)
                          : GG_KC ? swz<4, false>(lane % 16, lane / 16)
                                  : swz<4, true>(lane, 0);
    out[0] = frag;
}
"""
    assert "const unsigned frag = swz<4, false>(lane % 16, lane / 16);" in trim(source)


def test_a_dead_operand_a_lambda_captures_through_stays():
    source = """\
constexpr bool GG_REG = true;
extern "C" __global__ void k(int* out, int m)
{
    const bool col_in = m > 4;
    auto in = [&](int r) -> bool { return GG_REG ? r < m : col_in; };
    auto in2 = [&](int r) -> bool { return GG_REG ? r < m && col_in : col_in; };
    out[0] = in(1) + in2(2);
}
"""
    trimmed = trim(source)
    assert "return GG_REG ? r < m : col_in;" in trimmed  # col_in is named nowhere else in `in`
    assert "return r < m && col_in;" in trimmed


def test_code_after_a_jump_goes_unless_a_label_leads_there():
    source = """\
constexpr bool GG_SWAP = true;
extern "C" __global__ void k(int* out, int n)
{
    for (int i = 0; i < n; ++i) {
        if constexpr (GG_SWAP) {
            const int j = i + 1;
            out[j] = i;
            continue;  // stored
        }
        // the other layout
        out[i] = -i;
    }
    switch (n) {
    case 1:
        out[0] = 1;
        break;
    case 2:
        out[0] = 2;
    }
}
"""
    trimmed = trim(source)
    assert "out[i] = -i" not in trimmed and "the other layout" not in trimmed
    assert "continue;  // stored\n        }\n    }" in trimmed
    assert "case 2:\n        out[0] = 2;" in trimmed
    guarded = trim(source.replace("            continue;  // stored\n", "#if GG_STORED\n            continue;  // stored\n#endif\n"))
    assert "out[i] = -i" in guarded  # the jump may not be compiled: what follows stays


def test_a_used_helper_stays_and_an_unused_one_goes_with_its_comment():
    source = """\
#define GG_DEVICE __device__ __forceinline__

// ---- helpers ----

// Twice x.
GG_DEVICE int twice(int x) { return 2 * x; }

// Thrice x, through twice.
GG_DEVICE int thrice(int x) { return twice(x) + x; }

// Never called.
template <typename T>
GG_DEVICE T unused(T x) { return x; }
struct gg_unused_pair {
    int a, b;
};

// ---- packing (a section nothing in the file uses) ----

GG_DEVICE int pack(int x) { return x; }

// ---- host ----

// A host function that is neither inline nor internal: another file may call it.
int gg_exported(int x) { return x; }

extern "C" __global__ void k(int* out) { out[0] = thrice(out[0]); }
"""
    trimmed = trim(source)
    assert "// Twice x.\nGG_DEVICE int twice(int x)" in trimmed  # named by thrice, which the kernel calls
    assert "// Thrice x, through twice.\nGG_DEVICE int thrice" in trimmed
    assert "unused" not in trimmed and "Never called" not in trimmed  # the run under the comment went whole
    assert "pack" not in trimmed and "packing" not in trimmed  # the section and its heading
    assert "int gg_exported(int x)" in trimmed and "#define GG_DEVICE" in trimmed
    assert "// ---- helpers ----" in trimmed and "// ---- host ----" in trimmed


def test_unused_constants_go_one_declarator_at_a_time():
    source = """\
struct gg_launch {
    static constexpr bool persistent = false;  // unused
    static constexpr int split = 2;  // named as gg_launch::split
};
extern "C" __global__ void k(int* out)
{
    constexpr int A = 1, B = 2,
                  C = 3;
    out[0] = A + C + gg_launch::split;
}
"""
    trimmed = trim(source)
    assert "constexpr int A = 1,\n                  C = 3;" in trimmed
    assert "persistent" not in trimmed and "static constexpr int split = 2;  // named as gg_launch::split" in trimmed


def test_a_member_function_nothing_names_goes_with_its_comment_and_the_rest_of_the_struct_stays():
    source = """\
constexpr bool GG_SPLIT = false;
struct gg_work {
    int units, parts = 0;  // parts: kept, a data member

    __device__ gg_work(int n) : units(n)
    {
        if constexpr (GG_SPLIT)
            parts = split_parts();
    }
    // A range of fewer would cost more than it saves.
    static constexpr int MIN_PART = 4;
    // How many parts the split cuts: none without a split.
    __device__ int split_parts() const { return units / MIN_PART; }
    // The next unit (named by the kernel).
    __device__ bool next() { return --units >= 0; }
};

extern "C" __global__ void k(int* out)
{
    // the group's constants
    constexpr int A = 1;
    constexpr int B = 2;
    gg_work work(out[0]);
    while (work.next())
        out[1] += B;
}
"""
    trimmed = trim(source)
    assert "split_parts" not in trimmed and "How many parts" not in trimmed  # the function and its comment
    assert "MIN_PART" not in trimmed and "A range of fewer" not in trimmed  # then the constant it alone named
    assert "    // The next unit (named by the kernel).\n    __device__ bool next()" in trimmed
    assert "__device__ gg_work(int n) : units(n)" in trimmed and "int units, parts = 0;" in trimmed
    # A's comment heads B too: A goes, the comment stays
    assert "    // the group's constants\n    constexpr int B = 2;" in trimmed and "constexpr int A" not in trimmed


def test_the_scanner_tells_tokens_apart_by_their_first_characters():
    source = ('x = u8"a" + u\'b\' + L"c" + uint(.5) + a...b; p->*q <<= 1; a/b /* c */ // d\n'
              '  # define A(x) #x \\\n    ## x\n'
              'y # z ## w;\n')
    assert [(kind, text) for kind, text, _, _ in cxx.scan(source).offsets()] == [
        ("id", "x"), ("punct", "="), ("str", 'u8"a"'), ("punct", "+"), ("id", "u"), ("str", "'b'"),
        ("punct", "+"), ("str", 'L"c"'), ("punct", "+"), ("id", "uint"), ("punct", "("), ("num", ".5"),
        ("punct", ")"), ("punct", "+"), ("id", "a"), ("punct", "..."), ("id", "b"), ("punct", ";"),
        ("id", "p"), ("punct", "->*"), ("id", "q"), ("punct", "<<="), ("num", "1"), ("punct", ";"),
        ("id", "a"), ("punct", "/"), ("id", "b"), ("comment", "/* c */"), ("comment", "// d"),
        ("pp", "# define A(x) #x \\\n    ## x"),  # a directive, its continuation included
        ("id", "y"), ("punct", "#"), ("id", "z"), ("punct", "##"), ("id", "w"), ("punct", ";")]  # `#` mid-line


SPLICED = """\
int a; /* a comment
across lines */ int b;
  #define Q(x) \\
      (x + 1)
int c; int d;
// last"""


@pytest.mark.parametrize("edits", [
    [(SPLICED.index("int b;"), SPLICED.index("int b;") + 6, "")],  # on the line a comment ends on
    [(SPLICED.index("int a;"), SPLICED.index("int a;") + 6, "long a;")],  # on the line a comment starts on
    [(SPLICED.index("  #define"), SPLICED.index("int c;"), "")],  # a directive and its continuation
    [(SPLICED.index("int c;"), SPLICED.index("int c;") + 6, ""),  # two on one line
     (SPLICED.index("int d;"), SPLICED.index("int d;") + 6, "int e;")],
    [(SPLICED.index("int d;"), len(SPLICED), "#define R 2\n")],  # a directive made, the end of the file
    [(0, len(SPLICED), "")],
])
def test_the_tokens_of_a_spliced_text_are_a_fresh_scans(edits):
    new = cxx.splice(SPLICED, edits)
    expected = SPLICED
    for a, b, text in sorted(edits, reverse=True):
        expected = expected[:a] + text + expected[b:]
    assert new == expected
    assert cxx.read(new).offsets() == cxx.scan(new).offsets()


@pytest.mark.parametrize("point, arch", [("v4", "sm_90"), ("mma_fp16", "sm_90"), ("hopper_fp16", "sm_90a")])
def test_every_splice_of_a_trim_leaves_the_tokens_of_a_fresh_scan(point, arch, monkeypatch):
    made = []

    def checked(source, edits):
        new = cxx.splice(source, edits)
        assert cxx.read(new).offsets() == cxx.scan(new).offsets()
        made.append(new)
        return new

    # every module that splices: the package's fixpoint of branches and conditionals, and steps 3-5
    for module in (sys.modules["gemmgen.codegen.trim"], unreachable, unused):
        monkeypatch.setattr(module, "splice", checked)
    _trim(render_kernel(resolve_point(point, arch), untrimmed=True))
    assert len({len(m) for m in made}) >= 3  # branches, definitions and constants were cut


def test_threads_splicing_at_once_each_get_their_own_tokens():
    """Tuners and tests trim in several threads at once (the compile pools), and the tokens kept
    between passes are shared: a thread switch while one thread keeps its tokens must not break
    another's, nor give it the wrong ones."""
    def work(thread: int) -> bool:
        for i in range(2000):
            source = f"int a{thread}_{i};\nint b;\n"
            new = cxx.splice(source, [(source.index("int b;"), len(source), "long b;\n")])
            if cxx.read(new).offsets() != cxx.scan(new).offsets():
                return False
        return True

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        with ThreadPoolExecutor(8) as pool:
            assert all(pool.map(work, range(8)))
    finally:
        sys.setswitchinterval(old)


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.parametrize("point, arch", [("mma_fp16", "sm_90"), ("hopper_fp16", "sm_90a")])
def test_trimming_leaves_the_cubin_as_it_was(point, arch):
    config = resolve_point(point, arch)
    untrimmed = render_kernel(config, untrimmed=True)
    assert len(render_kernel(config).splitlines()) < 0.9 * len(untrimmed.splitlines())  # it trims something
    whole, trimmed = build_library(untrimmed, config.build_arch), build_once(config)
    assert whole.ok and trimmed.ok, whole.log + trimmed.log
    assert whole.cubin.read_bytes() == trimmed.cubin.read_bytes()


def test_a_trimmed_source_is_kept_in_the_cache_for_other_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMGEN_CACHE", str(tmp_path))
    source = BRANCHES + "// kept\n"  # a source this process has not trimmed (trim's own lru_cache)
    trimmed = trim(source)
    kept = list((tmp_path / "trimmed").iterdir())
    assert [p.read_text() for p in kept] == [trimmed]
    kept[0].write_text("// what another process trimmed\n")
    trim.cache_clear()  # as a new process would
    assert trim(source) == "// what another process trimmed\n"


def test_a_cache_that_cannot_be_written_costs_only_time(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("GEMMGEN_CACHE", str(tmp_path / "file" / "cache"))  # under a file: mkdir fails
    assert trim(BRANCHES + "// uncached\n") == trim.__wrapped__(BRANCHES + "// uncached\n")
    assert "if constexpr" not in trim(BRANCHES + "// uncached\n")
