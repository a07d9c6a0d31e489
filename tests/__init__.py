"""kbroker's test suite: unit, integration, docs, Spark, compat and bench tests."""

import os

# As importing kclient does (see kclient/__init__.py): gRPC's fork handlers kill some
# children of subprocess.Popen(preexec_fn=...), which the Spark tests' JVM start is. This
# package is imported before anything imports grpc (tests.conftest is its first module).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
