"""Build the compiled record codec, kclient._crecords (everything else is in pyproject.toml).

kclient.records (kclient/records/twins.py) falls back to pure Python when the module is missing or when
KBROKER_NO_EXTENSIONS=1; the build itself needs only a C compiler and the Python headers.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kclient._crecords",
            sources=["kclient/_crecords.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall"],
        )
    ]
)
