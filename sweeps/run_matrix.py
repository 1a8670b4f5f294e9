"""Run a matrix of cells on Ray: ``python sweeps/run_matrix.py [--matrix FILE] [--out DIR]``.

Connects to the cluster named by ``--address`` or ``RAY_ADDRESS``, else to the cluster that
``ray start --head`` recorded on this machine, else starts an embedded Ray of its own (never
another driver's). Results land in the dataset folder (default ``results/<matrix name>/``);
rerunning the same command resumes there. SIGINT or SIGTERM stops the sweep cleanly (exit 130 or
143; a second SIGINT stops at once), a lost cluster stops it with exit 4; either way a rerun
resumes.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

REPO_ROOT = Path(__file__).resolve().parent.parent
IN_SOURCE_CHECKOUT = (REPO_ROOT / "pyproject.toml").is_file()
"""Run from a checkout (not from site-packages after a plain ``pip install .``)."""
BUNDLED = Path(__file__).resolve().parent
"""Folder of the matrices that ship with the package (``smoke.yaml``, ``matrix.yaml``)."""
DEFAULT_MATRIX = BUNDLED / "matrix.yaml"
RUNTIME_ENV_EXCLUDES = [".git", ".venv", "results", "reports", "*.parquet", "*.json.gz", "*.pdf"]
"""Left out of the working_dir shipped to cluster nodes."""

log = logging.getLogger("commprof.sweep")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The driver's flags (shared by this script and ``commprof sweep``)."""
    from commprof.flags import positive_int, wait_seconds

    parser.add_argument(
        "--matrix",
        type=matrix_path,
        default=DEFAULT_MATRIX,
        help="matrix YAML file, or the name of a bundled one (smoke, matrix)",
    )
    parser.add_argument("--out", type=Path, help="dataset folder (default results/<name>/)")
    parser.add_argument(
        "--retry-failed", action="store_true", help="rerun only the cells whose last attempt failed"
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="TERM",
        help="run only cells matching TERM (key=value or a cell-id prefix); repeatable",
    )
    parser.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="TERM",
        help="skip cells matching TERM; repeatable",
    )
    parser.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else auto)")
    parser.add_argument(
        "--wait-lock",
        type=wait_seconds,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for another driver using the same --out (default: fail at once)",
    )
    parser.add_argument(
        "--max-concurrent", type=positive_int, help="at most this many cells at once (>= 1)"
    )
    parser.add_argument(
        "--num-cpus", type=positive_int, help="CPUs of an embedded Ray (default: enough)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def matrix_path(value: str) -> Path:
    """``--matrix``: a file, or the name of a matrix bundled with the package (``smoke``).

    A path that exists wins; a bare name without one resolves to ``<name>.yaml`` beside this
    module, so an installed wheel runs ``commprof sweep --matrix smoke`` from any folder.
    """
    path = Path(value)
    bundled = BUNDLED / f"{value}.yaml"
    if not path.exists() and path.name == value and bundled.is_file():
        return bundled
    return path


RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
"""The logger of Ray's notice that a new local cluster has token authentication on."""


@contextlib.contextmanager
def quiet_token_auth_notice() -> Iterator[None]:
    """Silence Ray's notice "Token authentication is enabled for this Ray cluster" while an
    embedded Ray starts.

    Ray 2.60 turns token authentication on for every new local cluster and says so on every
    start, with how to opt out. For the embedded Ray of a sweep the project keeps that default on
    purpose (it listens on 127.0.0.1 only, ``commprof.ray_address.init_local``; the token it
    writes to ``~/.ray/auth_token`` keeps other users' processes out), so the notice tells the
    user nothing to do;
    README.md, "On a cluster", explains the setting once for clusters users start themselves.
    Other warnings of that logger (authentication turned off) still print.
    """
    logger = logging.getLogger(RAY_AUTH_LOGGER)

    def keep(record: logging.LogRecord) -> bool:
        return "Token authentication is enabled" not in record.getMessage()

    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def connect(address: str | None, *, num_cpus: int) -> tuple[bool, str | None, str]:
    """Connect to a Ray cluster or start an embedded one.

    Args:
        address: an explicit address; None tries ``RAY_ADDRESS``, then the cluster ``ray start``
            recorded on this machine (``commprof.ray_address.cluster_address``).
        num_cpus: CPUs an embedded Ray advertises.

    Returns:
        (whether Ray was started here, the dashboard URL if there is one, the GCS address).
    """
    import ray

    from commprof.actors.gang import ACTOR_NAMESPACE
    from commprof.ray_address import attach, cluster_address, init_local

    address = cluster_address(address)
    if address is None:
        log.info(
            "no running Ray cluster found; starting an embedded one (%d CPUs, listening on "
            "127.0.0.1 only)",
            num_cpus,
        )
        with quiet_token_auth_notice():
            init_local(  # never attaches to a cluster found by scanning processes
                num_cpus=num_cpus,
                namespace=ACTOR_NAMESPACE,
                include_dashboard=False,
                log_to_driver=False,
            )
        return True, None, ray.get_runtime_context().gcs_address
    attach(address)  # its token, as Ray's CLI finds it; a one-line error if it cannot be used
    runtime_env: dict[str, Any] = {}
    if IN_SOURCE_CHECKOUT:  # ship this checkout; an installed package is on the nodes already
        runtime_env = {
            "working_dir": str(REPO_ROOT),
            "excludes": RUNTIME_ENV_EXCLUDES,
            "env_vars": {"PYTHONPATH": "."},
        }
    ctx = ray.init(
        address=address, namespace=ACTOR_NAMESPACE, runtime_env=runtime_env, log_to_driver=False
    )
    return False, ctx.dashboard_url or None, ray.get_runtime_context().gcs_address


def install_stop_handlers(driver: Any) -> None:
    """SIGINT and SIGTERM ask ``driver`` to stop after its current pass; a second SIGINT
    raises ``KeyboardInterrupt`` at once. Only from the main thread (Python's rule)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, frame: object) -> None:
        if driver.stop_signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        driver.request_stop(signum)  # first: a failed write below must not lose the request
        message = (
            f"\n{signal.Signals(signum).name}: stopping; the running cells are abandoned and run "
            "again when you rerun the same command (SIGINT again: stop at once)\n"
        )
        os.write(2, message.encode())  # not print(): the handler may interrupt a stderr write

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)


def restore_signal_handlers() -> None:
    """Python's own SIGINT (KeyboardInterrupt) and the default SIGTERM, once the loop is done."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the driver; returns the process exit status."""
    parser = argparse.ArgumentParser(prog="run_matrix.py", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run the driver for parsed arguments (see :func:`add_arguments`)."""
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from commprof import matrix as matrix_mod
    from commprof.lock import DatasetLock, DatasetLocked
    from commprof.results import check_writable

    try:
        matrix = matrix_mod.load(args.matrix)
    except matrix_mod.MatrixError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = args.out or Path("results") / matrix.name  # relative to where the user runs it
    from commprof.sweeps.plan import select

    try:
        selected = select(matrix.cells, tuple(args.only), tuple(args.exclude))
        check_writable(out)  # before Ray starts and before any cell runs
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    max_ws = max((c.world_size for c in selected), default=1)
    num_cpus = args.num_cpus or max(os.cpu_count() or 1, max_ws)
    try:
        with DatasetLock(out, wait_s=args.wait_lock) as lock:  # one driver per dataset folder
            return _run_locked(args, matrix, selected, out, num_cpus, lock)
    except DatasetLocked as err:  # LockLost too: taken over, stopped before writing
        print(f"error: {err}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print(
            "interrupted: committed cells are kept; rerun the same command to resume",
            file=sys.stderr,
        )
        return 128 + signal.SIGINT


def nothing_to_run(args: argparse.Namespace, matrix: Any, selected: list[Any], out: Path) -> bool:
    """Whether every selected cell is settled in the dataset, so no Ray need start.

    The same plan the driver makes (``commprof.attempts.plan_cells``) from the dataset as it is
    now: complete cells and failures that stand are settled. A cell rejected earlier counts as
    settled only where the guard, with this machine's budgets, still rejects it and no running
    cluster would cost it with other budgets (an embedded Ray runs on this machine).
    """
    from commprof.attempts import FailurePolicy, plan_cells, resume_state
    from commprof.ray_address import cluster_address
    from commprof.sweeps.guard import GuardPlan

    local = GuardPlan(matrix) if cluster_address(args.address) is None else None
    plan = plan_cells(
        selected,
        resume_state(out),
        (lambda cell: local.decide(cell).feasible) if local is not None else (lambda cell: True),
        FailurePolicy(max_attempts=matrix.run.max_attempts),
        retry_failed=args.retry_failed,
    )
    return not plan.todo and not plan.rejected


def _nothing_to_run_exit(
    matrix: Any, selected: list[Any], out: Path, args: argparse.Namespace
) -> int:
    """Say that nothing is left to run, with the dataset's summary; exit as a finished sweep."""
    from commprof.analysis.summary import summary_table
    from commprof.results import latest_status

    latest = latest_status(out)
    ids = list(dict.fromkeys(c.cell_id for c in selected))
    failed = [i for i in ids if latest.get(i, ("",))[0] == "failed"]
    if ids and out.is_dir():
        from commprof.results import load

        print(summary_table(load(out), ids))
    what = "no cell selected" if not ids else f"all {len(ids)} selected cells are settled"
    hint = " (rerun with --retry-failed)" if failed and not args.retry_failed else ""
    print(
        f"sweep {matrix.name!r}: nothing to run, {what} in {out}: "
        f"{len(ids) - len(failed)} complete or rejected, {len(failed)} failed{hint}; Ray was "
        "not started"
    )
    return 1 if failed else 0


def _run_locked(
    args: argparse.Namespace,
    matrix: Any,
    selected: list[Any],
    out: Path,
    num_cpus: int,
    lock: Any,
) -> int:
    """The sweep itself, run while this process owns the dataset folder."""
    import ray

    from commprof.lock import DatasetLocked
    from commprof.results import load
    from commprof.sweeps.cluster import EXIT_CLUSTER_LOST, ClusterLost, ClusterWatch
    from commprof.sweeps.driver import Driver, DriverOptions

    if nothing_to_run(args, matrix, selected, out):
        return _nothing_to_run_exit(matrix, selected, out, args)
    try:
        started_here, dashboard, gcs_address = connect(args.address, num_cpus=num_cpus)
    except ConnectionError as err:  # attach() says what to set, before Ray's own retries
        print(f"error: {err}", file=sys.stderr)
        return 2
    if dashboard:
        print(f"Ray dashboard: {dashboard}", file=sys.stderr)
    print(
        f"sweep {matrix.name!r}: {len(selected)} cells from {matrix.source} -> {out}",
        file=sys.stderr,
    )
    options = DriverOptions(
        out=out,
        retry_failed=args.retry_failed,
        only=tuple(args.only),
        exclude=tuple(args.exclude),
        max_concurrent=args.max_concurrent,
    )
    # The watch stays on through ray.shutdown(): a call to a dead GCS there would block too.
    with ClusterWatch(gcs_address) as watch:
        lost = False
        try:
            driver = Driver(matrix, options, watch=watch, lock=lock)
            install_stop_handlers(driver)  # after ray.init, which sets its own SIGTERM handler
            summary = driver.run()
        except ClusterLost as err:
            lost = True
            print(f"error: {err}", file=sys.stderr)
            return EXIT_CLUSTER_LOST
        except DatasetLocked:
            raise  # LockLost: the caller says it and exits 3
        except (ValueError, RuntimeError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        finally:
            restore_signal_handlers()
            if started_here or not lost:
                ray.shutdown()
    if out.is_dir():
        from commprof.analysis.summary import summary_table

        print(summary_table(load(out), [c.cell_id for c in selected]))
    print(
        f"{summary.ok} ok, {summary.failed} failed, {summary.rejected} rejected, "
        f"{summary.skipped} already complete, {summary.failed_earlier} failed earlier (rerun "
        f"with --retry-failed); {summary.attempts} attempts in {summary.wall_s:.1f} s; "
        f"dataset: {out}"
    )
    if summary.stopped_by is not None:
        print(
            f"stopped by {summary.stopped_by}: {summary.abandoned} running attempts abandoned "
            "(not recorded); rerun the same command to resume"
        )
        return 128 + signal.Signals[summary.stopped_by].value
    return 1 if summary.failed or summary.failed_earlier else 0


if __name__ == "__main__":
    sys.exit(main())
