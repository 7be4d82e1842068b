"""Build the compiled OTLP decoder (collector._otlpfast); project metadata stays in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("collector._otlpfast", ["collector/_otlpfast.c"], extra_compile_args=["-O2"])])
