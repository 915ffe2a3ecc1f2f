"""What a new user meets first: the command line, the version, and the interpreter switch. Each case runs
in a fresh Python, since what it checks (torch not loaded yet, kernels not defined yet) is process state."""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flashtriton
from conftest import ON_GPU
from flashtriton.tools import cli

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _python(code: str, interpret: bool | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    if interpret is not None:
        env["TRITON_INTERPRET"] = "1" if interpret else "0"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_help_and_version_answer_without_loading_torch():
    code = """
import sys
from flashtriton.tools.cli import main
for argv in (["--version"], ["--help"], ["bench", "--help"], ["sweep", "--help"], ["roofline", "--help"],
             ["inspect", "--help"]):
    try:
        main(argv)
    except SystemExit as exit:
        assert exit.code == 0, (argv, exit.code)
assert "torch" not in sys.modules, "torch was loaded"
assert "triton" not in sys.modules, "triton was loaded"
"""
    out = _python(code)
    assert out.returncode == 0, out.stderr
    assert f"flashtriton {flashtriton.__version__}" in out.stdout
    assert "Compile the forward and backward kernels for Hopper" in out.stdout  # inspect's description


def test_every_subcommand_and_option_explains_itself():
    parser = cli._parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices
    assert set(subparsers) == {"bench", "sweep", "roofline", "inspect"}
    for name, sub in subparsers.items():
        assert sub.description, f"{name} has no description"
        for action in sub._actions:
            assert action.help, f"{name} {action.option_strings} has no help text"


@pytest.mark.parametrize("argv, message", [
    (["bench", "--providers", "flashtriton,fa9"], "unknown fa9; choose from flashtriton, sdpa"),
    (["bench", "--modes", "fwd,back"], "unknown back; choose from fwd, bwd, fwd_bwd"),
    (["bench", "--variants", "gqa,mla"], "unknown mla; choose from "),
    (["bench", "--seqlens", "1k"], "'1k' is not a comma-separated list of ints"),
    (["bench", "--suite", "huge"], "invalid choice: 'huge'"),
    (["roofline", "--providers", "cudnn"], "unknown cudnn; choose from flashtriton"),
    (["inspect", "--dtypes", "int8"], "unknown int8; choose from bf16, fp16, fp32, fp8"),
    (["inspect", "--head-dims", ""], "unknown empty list"),
])
def test_unknown_choices_are_rejected_with_the_valid_ones(argv, message, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(argv)
    assert exit.value.code == 2
    assert message in capsys.readouterr().err


def test_inspect_fp8_needs_gluon_or_decode():
    """fp8 is only the Gluon forward's form and the decode kernel's FP8 cache: without --gluon or --decode,
    a clear exit, not a crash in the Triton kernels."""
    with pytest.raises(SystemExit, match="--dtypes fp8 is the Gluon forward's FP8 form or the decode kernel's "
                                         "FP8 cache: add --gluon or --decode"):
        cli.main(["inspect", "--dtypes", "fp8"])


def test_one_version():
    """pyproject.toml reads the version from flashtriton.__version__; an installed copy reports the same."""
    try:
        installed = importlib.metadata.version("flashtriton")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("flashtriton is not installed (run from the source tree)")
    assert installed == flashtriton.__version__


def test_interpreter_switched_on_after_the_kernels_are_defined():
    """Triton reads TRITON_INTERPRET when the kernels are defined: set later, it used to end in Triton's
    "0 active drivers"; now it is our error, saying what to do. Importing flashtriton alone defines no
    kernels, so setting it after `import flashtriton` but before the first call still works."""
    call = """
import torch
q = torch.randn(1, 2, 17, 16)
try:
    flashtriton.flash_attention(q, q, q)
except (RuntimeError, ValueError) as error:
    print(type(error).__name__, error)
else:
    print("ran")
"""
    late = _python("import os, flashtriton, flashtriton.kernels.forward\n"
                   "os.environ['TRITON_INTERPRET'] = '1'" + call)
    assert "RuntimeError TRITON_INTERPRET=1 was set after flashtriton was imported" in late.stdout, late.stderr
    if not ON_GPU:  # (the GPU machine's NumPy is too new for Triton 3.6's interpreter)
        lazy = _python("import os, flashtriton\nos.environ['TRITON_INTERPRET'] = '1'" + call)
        assert lazy.stdout.strip() == "ran", lazy.stderr
    never = _python("import flashtriton" + call)
    assert "ValueError q, k and v are on cpu, but the kernels run on CUDA GPUs" in never.stdout, never.stderr


def test_dependency_bounds_are_the_tested_versions():
    """pyproject.toml admits torch and Triton from CI's oldest pair up to the minor release of its newest
    (.ci/versions.sh), and nothing beyond: a newer Triton may remove what the kernels use, as 3.9 removed
    block pointers."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    root = Path(SRC).parent
    pairs = dict(line.split("#")[0].strip().split("=") for line in (root / ".ci" / "versions.sh").read_text()
                 .splitlines() if "=" in line.split("#")[0])
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]

    def bounds(oldest: str, newest: str) -> str:
        major, minor = newest.split(".")[:2]
        return f">={'.'.join(oldest.split('.')[:2])},<{major}.{int(minor) + 1}"

    assert deps == [f"torch{bounds(pairs['OLDEST_TORCH'], pairs['NEWEST_TORCH'])}",
                    f"triton{bounds(pairs['OLDEST_TRITON'], pairs['NEWEST_TRITON'])}"]


def test_interpreter_without_numpy_says_which_extra_brings_it():
    code = """
import sys
sys.modules["numpy"] = None  # as if NumPy were not installed
import torch, flashtriton
try:
    flashtriton.flash_attention(torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8))
except ImportError as error:
    print(error)
"""
    out = _python(code, interpret=True)
    assert "needs NumPy: pip install 'flashtriton[cpu]'" in out.stdout, out.stderr[-2000:]


@pytest.mark.skipif(ON_GPU, reason="the CPU's main job: on a GPU, bench times the suite")
def test_main_job_without_a_gpu_runs_the_interpreted_check():
    """`python -m flashtriton bench` on a machine without a GPU and without TRITON_INTERPRET set: it must
    switch the interpreter on before anything defines the kernels (the benchmark's own imports included)."""
    out = _python("import sys\nfrom flashtriton.tools.cli import main\nsys.exit(main(['bench']))")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Timing needs a GPU" in out.stdout and "all checks passed" in out.stdout, out.stdout[-2000:]


def test_core_and_interfaces_import_only_torch_and_triton():
    """transformers is an optional extra ([hf]): only flashtriton.integrations.transformers imports it."""
    result = _python("""
import sys
import flashtriton, flashtriton.api, flashtriton.ops, flashtriton.sdpa, flashtriton.nn
import flashtriton.flash_attn_interface, flashtriton.integrations
assert "transformers" not in sys.modules, "the core imported transformers"
print("ok")
""", interpret=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
