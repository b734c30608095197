import pytest

from jobs.conf import DEFAULTS

TEST_MODULES = ",".join([*DEFAULTS["OPERATION_MODULES"], "tests.ops"])


@pytest.fixture
def worker(start_process):
    """Start ``runworker`` with test operations loaded and small knobs."""

    def start(*queues: str, args: tuple[str, ...] = (), env: dict | None = None):
        flags = [a for q in (queues or ("default",)) for a in ("--queue", q)]
        return start_process(
            "runworker",
            *flags,
            *args,
            env={"CONTROLPLANE_OPERATION_MODULES": TEST_MODULES, **(env or {})},
        )

    return start


@pytest.fixture(autouse=True)
def _test_operations():
    import tests.ops  # noqa: F401 - registers test operations in this process too
