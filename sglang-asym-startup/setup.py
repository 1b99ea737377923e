"""Ships sglang_asym_startup.pth into site-packages (a .pth is not a module, so build_py adds it).

The main package is installed editable, and editable wheels carry no root files; this one is
installed as a regular wheel beside it (scripts/setup.sh)."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "sglang_asym_startup.pth"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file(PTH, os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildPyWithPth})
