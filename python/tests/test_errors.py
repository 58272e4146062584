"""Issue 33: one exception root. Every exception class the package defines (found by walking its
modules, so that a new one cannot be forgotten) derives from tenure.TenureError and still from the
base it had before, so that neither ``except tenure.TenureError`` nor an older ``except`` misses
it; the root, the name codec and the URL grammar import without tooz (an optional dependency).
"""

import importlib
import os
import pkgutil
import subprocess
import sys
import unittest
from typing import Dict, Type

import tenure

try:
    from tooz import coordination
except ImportError:  # tooz is an optional dependency
    coordination = None  # type: ignore[assignment]

#: Each exception class the package defines, with the base it had before (the builtin it replaces
#: for the ones issue 33 added: BadAddress, LeadTimeout, BinaryNotFound, WriteFailed, BadName, BadURL).
OLD_BASES: Dict[str, Type[BaseException]] = {
    "tenure._http.SidecarError": OSError,
    "tenure._http.BadAddress": ValueError,
    "tenure.elect.NotLeading": Exception,
    "tenure.elect.LeadTimeout": TimeoutError,
    "tenure.member.StillAssigned": Exception,
    "tenure.process.StartError": RuntimeError,
    "tenure.process.BinaryNotFound": FileNotFoundError,
    "tenure.process.WriteFailed": RuntimeError,
    "tenure.process.Deposed": RuntimeError,
    "tenure.tooz.names.BadName": ValueError,
    "tenure.tooz.url.BadURL": ValueError,
}
if coordination is not None:
    OLD_BASES["tenure.tooz.driver.SessionExpired"] = coordination.ToozConnectionError


def defined_exceptions() -> Dict[str, Type[BaseException]]:
    """Every exception class defined in a module of the package (those that need tooz skipped
    where it is not installed)."""
    found = {}
    for module_info in pkgutil.walk_packages(tenure.__path__, "tenure."):
        try:
            module = importlib.import_module(module_info.name)
        except ImportError as error:
            if coordination is None and (error.name or "").split(".")[0] == "tooz":
                continue
            raise
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


class ErrorsTest(unittest.TestCase):
    def test_every_exception_derives_from_the_root_and_keeps_its_old_base(self) -> None:
        found = defined_exceptions()
        self.assertIs(found.pop("tenure._errors.TenureError"), tenure.TenureError)
        self.assertEqual(sorted(found), sorted(OLD_BASES), "an exception class without its old base listed here")
        for name, cls in found.items():
            self.assertTrue(issubclass(cls, tenure.TenureError), name)
            self.assertTrue(issubclass(cls, OLD_BASES[name]), name)
            self.assertIsInstance(cls("message"), OLD_BASES[name])
            if not name.startswith("tenure.tooz."):  # the Tooz driver's own stay in tenure.tooz
                self.assertIs(getattr(tenure, cls.__name__), cls, f"tenure.{cls.__name__} is not exported")

    def test_the_root_the_name_codec_and_the_url_grammar_need_no_tooz(self) -> None:
        code = "import sys; sys.modules['tooz'] = None; import tenure, tenure.tooz.names, tenure.tooz.url"
        package_parent = os.path.dirname(os.path.dirname(tenure.__file__))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([package_parent, os.environ.get("PYTHONPATH", "")])}
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, check=False)
        self.assertEqual(result.returncode, 0, result.stderr.decode())


if __name__ == "__main__":
    unittest.main()
