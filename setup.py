"""Ships python/sglang_asym_startup.pth into site-packages, in regular and in editable installs.

A .pth file is not a module, so no setuptools option places it at the root of site-packages. A regular
wheel gets it from build_py's output folder. An editable wheel (`pip install -e .`) is built from
`install_lib` instead, which setuptools points at the wheel's root, while the package itself stays a
path entry to python/; the hook is written there so editable installs get it too.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "sglang_asym_startup.pth"
SOURCE = os.path.join("python", PTH)


class BuildPyWithStartupHook(build_py):
    def run(self):
        super().run()
        self.copy_file(SOURCE, self._hook_target())

    def _hook_target(self) -> str:
        if getattr(self, "editable_mode", False):
            return os.path.join(self.get_finalized_command("install").install_lib, PTH)
        return os.path.join(self.build_lib, PTH)

    def get_outputs(self, include_bytecode=1):
        outputs = super().get_outputs(include_bytecode)
        return outputs if getattr(self, "editable_mode", False) else outputs + [os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildPyWithStartupHook})
