"""The exception root, in a module of its own so that every other module can import it."""


class TenureError(Exception):
    """The base of every exception this package defines, so that one ``except
    tenure.TenureError`` catches every error the package reports itself. Each keeps the builtin
    base it had before (``OSError``, ``RuntimeError``...), so that no ``except`` written against
    those changes behaviour. Not under it: the operating system's errors passed on (a ``tenure``
    that cannot be executed), ``TypeError`` for an argument of the wrong type, and the errors the
    Tooz driver raises to Tooz's callers, which are Tooz's own as Tooz's API says (its
    ``SessionExpired`` is both)."""
