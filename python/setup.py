"""setup.py: only to put the engine's shared library into the package when it is built
(`pip install ./python`): $SPARKMONO_LIB, else ../build/libsparkmono.so from `make shared`.
Without one the package still installs and looks for the library at import time
(sparkmono/_lib.py says where).  We rejected compiling the C sources here: the project's
Makefile is the one build, and the wheel would need a compiler."""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithLib(build_py):
    def run(self):
        super().run()
        src = os.environ.get("SPARKMONO_LIB") or os.path.join(HERE, "..", "build", "libsparkmono.so")
        if os.path.isfile(src):
            dst = os.path.join(self.build_lib, "sparkmono", "libsparkmono.so")
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy(src, dst)
        else:
            print("sparkmono: %s not found (run `make shared`); set SPARKMONO_LIB at run time" % src)


setup(cmdclass={"build_py": BuildPyWithLib})
