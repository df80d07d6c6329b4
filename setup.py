"""The one compiled part: the fast way in for raw records (tailwatch/ingest/_columnar.c).
Everything else is declared in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tailwatch.ingest._columnar", ["tailwatch/ingest/_columnar.c"],
                             extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                                 "-Wno-missing-field-initializers"])])
