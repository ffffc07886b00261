"""IPython magics: ``%load_ext pytest_memlab``, then ``%mlrun`` (a statement)
and ``%%mlrun`` (a cell), with pytorch_memlab's flags."""

from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, needs_local_scope
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .line_profiler import DEFAULT_COLUMNS, LineProfiler


@magics_class
class MemlabMagics(Magics):
    @magic_arguments()
    @argument("-f", "--function", metavar="FUNC", action="append", default=[],
              help="function to profile; repeatable")
    @argument("-c", "--column", metavar="COLS", action="append", default=[],
              help="column to display; repeatable (see pytest_memlab.lab.COLUMNS)")
    @argument("-D", "--no_default_columns", action="store_true",
              help="hide the default columns " + ", ".join(DEFAULT_COLUMNS))
    @argument("-r", "--return-profiler", action="store_true",
              help="return the LineProfiler object instead of displaying it")
    @argument("-g", "--gpu", metavar="GPU_ID", default=None,
              help="device to profile: a CUDA index, or 'cpu' (default: cuda:0 where there is CUDA, else cpu)")
    @argument("-q", "--quiet", action="store_true", help="do not display the results")
    @argument("-T", "--dump-profile", metavar="OUTPUT", help="write the text results to OUTPUT")
    @argument("statement", nargs="*", default=None, help="code to run (omit it in %%mlrun)")
    @line_cell_magic
    @needs_local_scope
    def mlrun(self, line=None, cell=None, local_ns=None):
        """Runs a statement or a cell under pytest-memlab's line profiler."""
        args = parse_argstring(self.mlrun, line)
        namespace = dict(self.shell.user_ns)
        namespace.update(local_ns or {})
        funcs = []
        for name in args.function:
            try:
                funcs.append(eval(name, namespace))
            except Exception as exc:
                raise UsageError(f"%mlrun: could not find function {name!r}: {type(exc).__name__}: {exc}") from None
        gpu = args.gpu
        if gpu is not None and gpu != "cpu":
            try:
                gpu = int(gpu)
            except ValueError:
                raise UsageError(f"%mlrun: -g {gpu!r} is not a CUDA index or 'cpu'") from None
        code = cell if cell is not None else " ".join(args.statement or [])
        if not code.strip():
            raise UsageError("%mlrun: nothing to run")
        profiler = LineProfiler(*funcs, target_gpu=gpu)
        with profiler:
            exec(compile(code, "<mlrun>", "exec"), self.shell.user_ns, local_ns)
        columns = ([] if args.no_default_columns else list(DEFAULT_COLUMNS)) + args.column
        if args.dump_profile:
            with open(args.dump_profile, "w") as f:
                profiler.print_stats(columns=columns, stream=f)
        if args.return_profiler:
            return profiler
        if not args.quiet:
            return profiler.display(columns=columns)
        return None


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(MemlabMagics)
