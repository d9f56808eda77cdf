"""setup.py: only to put the engine's shared library into the package when it is built
(`pip install ./python`): $SPARKMONO_LIB, else ../build/libsparkmono.so from `make shared`.
Without one the package still installs and looks for the library at import time
(sparkmono/_lib.py says where).  We rejected compiling the C sources here: the project's
Makefile is the one build, and the wheel would need a compiler.  The package's version is
the one include/sparkmono.h beside this folder defines, else the library's
(sparkmono_version()): the project has one version string."""
import ctypes
import os
import re
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def lib_path():
    return os.environ.get("SPARKMONO_LIB") or os.path.join(HERE, "..", "build", "libsparkmono.so")


def version():
    """include/sparkmono.h's SPARKMONO_VERSION when the source tree is beside this folder (read,
    not loaded: a sanitizer build's library cannot be loaded without its runtime), else the
    library's sparkmono_version()."""
    hdr = os.path.join(HERE, "..", "include", "sparkmono.h")
    m = re.search(r'#define SPARKMONO_VERSION "([^"]+)"', open(hdr).read()) if os.path.isfile(hdr) else None
    if m:
        return m.group(1)
    src = lib_path()
    if not os.path.isfile(src):
        raise SystemExit("sparkmono: neither %s nor %s: cannot tell the version" % (hdr, src))
    f = ctypes.CDLL(os.path.abspath(src)).sparkmono_version
    f.restype = ctypes.c_char_p
    return f().decode()


class BuildPyWithLib(build_py):
    def run(self):
        super().run()
        src = lib_path()
        if os.path.isfile(src):
            dst = os.path.join(self.build_lib, "sparkmono", "libsparkmono.so")
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy(src, dst)
        else:
            print("sparkmono: %s not found (run `make shared`); set SPARKMONO_LIB at run time" % src)


setup(version=version(), cmdclass={"build_py": BuildPyWithLib})
