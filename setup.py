"""The one compiled part of the package (the rest is in pyproject.toml): the float casts of convert-eagle in C.

Optional: where it cannot be built (no C compiler), the package installs without it and casts with numpy."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("neuronpack.convert._float_cast", ["neuronpack/convert/_float_cast.c"], optional=True,
                             extra_compile_args=["-O3", "-std=c11"])])
