"""Stand-ins for the modules SGLang 0.5.23 imports but a CPU-only machine cannot provide.

SGLang imports a few GPU-only packages at module level from code that a CPU process never
calls. Without them `sglang.srt.configs`, the disaggregation package and the model files do
not import at all:
- `torchvision`: PyPI ships CUDA builds only, and they fail to import beside the CPU torch
  (their `_C.so` needs libc10_cuda). SGLang reaches it through multimodal helpers
  (`srt/configs/__init__` -> `nano_nemotron_vl` -> `multimodal/internvl_utils`).
- `vllm._custom_ops`: imported by some kernels' fallbacks; vLLM is not installed here.

`install()` puts a meta-path finder in front that answers imports of exactly those package
trees, and only when the real package is not importable. Every attribute of a stand-in
module is a `MissingAttribute` that raises `ModuleNotFoundError` naming the package as soon
as it is called or used, so a code path that really needs the package fails loudly.
Serving processes on a GPU machine have the real packages and never install these.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

# Top-level package -> why it is missing on CPU (shown in every error).
GAPS: dict[str, str] = {
    "torchvision": "PyPI ships only CUDA builds of torchvision; none imports beside torch CPU",
    "vllm": "vLLM is not installed beside SGLang on CPU machines",
}


class MissingAttribute:
    """A name imported from a stand-in module; any use raises ModuleNotFoundError."""

    def __init__(self, qualname: str, reason: str) -> None:
        self._qualname = qualname
        self._reason = reason

    def _fail(self) -> ModuleNotFoundError:
        root = self._qualname.split(".")[0]
        return ModuleNotFoundError(f"{self._qualname} is unavailable on this CPU machine: {self._reason}", name=root)

    def __call__(self, *args, **kwargs):
        raise self._fail()

    def __getattr__(self, name: str) -> "MissingAttribute":
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return MissingAttribute(f"{self._qualname}.{name}", self._reason)

    def __repr__(self) -> str:
        return f"<missing {self._qualname}>"


class _StandInModule(types.ModuleType):
    def __init__(self, name: str, reason: str) -> None:
        super().__init__(name, f"CPU stand-in for {name}: {reason}")
        self.__path__ = []  # a package, so that submodule imports reach the finder
        self._reason = reason

    def __getattr__(self, name: str) -> MissingAttribute:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return MissingAttribute(f"{self.__name__}.{name}", self._reason)


class _GapFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: dict[str, str]) -> None:
        self.roots = roots

    def find_spec(self, fullname, path=None, target=None):
        root = fullname.split(".")[0]
        if root not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return _StandInModule(spec.name, self.roots[spec.name.split(".")[0]])

    def exec_module(self, module) -> None:
        return None


_installed: _GapFinder | None = None


def _real_package_importable(root: str) -> bool:
    if importlib.util.find_spec(root) is None:
        return False
    try:
        importlib.import_module(root)
    except Exception:  # an installed but broken build (torchvision CUDA wheel) counts as missing
        sys.modules.pop(root, None)
        return False
    return True


def _settle_transformers_torchvision_probe() -> None:
    # transformers decides "is torchvision available" with importlib.util.find_spec, which the
    # finder would answer; its answer is lru-cached, so asking it first keeps it truthful (False).
    try:
        from transformers.utils import import_utils
    except ImportError:
        return
    if import_utils.is_torchvision_available():
        raise RuntimeError("transformers reports torchvision available although it does not import")


def install(roots: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Installs stand-ins for the missing packages of GAPS (or of `roots`, a subset); returns their
    names. Idempotent: the first call decides."""
    global _installed
    if _installed is not None:
        return tuple(_installed.roots)
    wanted = GAPS if roots is None else {root: GAPS[root] for root in roots}
    missing = {root: why for root, why in wanted.items() if not _real_package_importable(root)}
    if "torchvision" in missing:
        _settle_transformers_torchvision_probe()
    _installed = _GapFinder(missing)
    sys.meta_path.insert(0, _installed)
    return tuple(missing)
