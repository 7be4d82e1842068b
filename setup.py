"""Build the compiled OTLP decoder (collector._otlpfast); project metadata stays in pyproject.toml.

The extension is optional so that `pip install driftscope` (the guards alone, for agent code)
works without a C compiler; `make install` checks that it built for the server.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("collector._otlpfast", ["collector/_otlpfast.c"], extra_compile_args=["-O2"], optional=True)
    ]
)
