"""The laboratory API on CPU tensors (CUDA in test_cuda.py): pytorch_memlab's
README examples with exact figures, the decorators, and the magics."""

import io
import subprocess
import sys
import textwrap

import pytest

from conftest import requires_torch

pytestmark = requires_torch

LINEAR_100 = 100 * 100 * 4 + 100 * 4  # Linear(100, 100) on the CPU: weight and bias, float32


def inner():
    import torch
    torch.nn.Linear(100, 100)


def outer():
    import torch
    linear = torch.nn.Linear(100, 100)
    linear2 = torch.nn.Linear(100, 100)
    inner()


def lines_of(fn):
    import inspect

    src, first = inspect.getsourcelines(fn)
    return {line.strip(): first + i for i, line in enumerate(src)}


def test_readme_line_profiler_example_has_exact_figures():
    from pytest_memlab import LineProfiler

    with LineProfiler(outer, inner, target_gpu="cpu") as prof:
        outer()
    rec = prof.records[(outer.__code__, "cpu")]
    at = lines_of(outer)
    assert rec[at["linear = torch.nn.Linear(100, 100)"]].peak_total == LINEAR_100
    assert rec[at["linear2 = torch.nn.Linear(100, 100)"]].peak_total == 2 * LINEAR_100
    assert rec[at["inner()"]].peak_total == 3 * LINEAR_100  # callee included
    assert rec[at["inner()"]].allocated == 0  # inner's own line allocated it
    irec = prof.records[(inner.__code__, "cpu")]
    assert irec[lines_of(inner)["torch.nn.Linear(100, 100)"]].allocated == LINEAR_100
    text = str(prof.display())
    assert "## outer" in text and "## inner" in text
    assert "active_bytes.* shown as allocated bytes" in text
    out = io.StringIO()
    prof.print_stats("outer", columns=("allocated_bytes.all.peak", "hits"), stream=out)
    table = out.getvalue()
    assert "## inner" not in table
    row = next(line for line in table.splitlines() if line.endswith("linear2 = torch.nn.Linear(100, 100)"))
    assert "78.9 KiB" in row and " 1 " in row
    with pytest.raises(ValueError, match="unknown column 'nope'"):
        prof.display(columns=("nope",))


def test_enable_disable_and_add_function():
    from pytest_memlab import LineProfiler

    prof = LineProfiler(target_gpu="cpu")
    prof.add_function(inner)
    prof.enable()
    inner()
    inner()
    prof.disable()
    rec = prof.records[(inner.__code__, "cpu")]
    assert rec[lines_of(inner)["torch.nn.Linear(100, 100)"]].hits == 2
    assert "<td" in prof.display()._repr_html_()


def run_script(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**__import__("os").environ, "MEMLAB_CORE": "bridge"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_profile_decorator_prints_at_exit_and_works_on_methods(tmp_path):
    script = tmp_path / "prof.py"
    script.write_text(textwrap.dedent("""
        import torch
        from pytest_memlab import profile, set_target_gpu
        set_target_gpu("cpu")

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(100, 100)

            @profile
            def forward(self, inp):
                return self.linear(inp)

        net = Net()
        for _ in range(3):
            net(torch.ones(50, 100))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True).stdout
    assert "## Net.forward" in out
    row = next(line for line in out.splitlines() if line.endswith("return self.linear(inp)"))
    # the output, 50x100 float32 = 20000 B; the input was made before profiling,
    # and CPU totals count what was allocated while memlab measured
    assert "19.5 KiB" in row


def test_profile_every_prints_every_n_runs(tmp_path):
    out = run_script("""
        import torch
        from pytest_memlab import profile_every, set_target_gpu
        set_target_gpu("cpu")

        @profile_every(2)
        def work():
            x = torch.empty(1000, dtype=torch.uint8)

        for _ in range(5):
            work()
    """)
    assert out.count("## work") == 2


def test_ipython_magics(tmp_path):
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "pytest_memlab")
    shell.run_cell("import torch\ndef func(n):\n    x = torch.empty(n, dtype=torch.uint8)\n    return x\n")
    shown = shell.run_line_magic("mlrun", "-f func -g cpu func(4096)")
    assert "## func" in str(shown)
    prof = shell.run_line_magic("mlrun", "-r -f func -g cpu func(2048)")
    rec = prof.records[(shell.user_ns["func"].__code__, "cpu")]
    assert max(r.allocated for r in rec.values()) == 2048
    dump = tmp_path / "out.txt"
    assert shell.run_line_magic("mlrun", f"-q -T {dump} -f func -g cpu -c hits -D func(10)") is None
    assert "hits" in dump.read_text() and "active_bytes" not in dump.read_text()
    cell = shell.run_cell_magic("mlrun", "-f func -g cpu", "y = func(100)\n")
    assert "## func" in str(cell)
    with pytest.raises(Exception, match="could not find function 'nope'"):
        shell.run_line_magic("mlrun", "-f nope -g cpu func(1)")
