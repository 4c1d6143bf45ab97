# Entering a request and running its code as `python3 -c CODE` runs it, for the interpreters
# sqbox starts before their request (prestart.py, zygote.py): the server puts this file before
# each of them.
import os
import sys


def _enter(env, workdir):
    """The request's environment additions (KEY=VALUE, each ended by a NUL byte) and working
    directory (none: stay where the sandbox started)."""
    for entry in env.split(b"\0")[:-1]:
        key, _, value = entry.partition(b"=")
        os.environb[key] = value
    if workdir:
        os.chdir(workdir)


def _run(code):
    main = type(sys)("__main__")
    main.__builtins__ = sys.modules["builtins"]
    main.__loader__ = sys.modules["__main__"].__loader__
    main.__annotations__ = {}
    sys.modules["__main__"] = main
    sys.argv[:] = ["-c"]
    try:
        exec(compile(code, "<string>", "exec"), main.__dict__)
    except SystemExit:
        raise
    except BaseException as error:
        # As `python3 -c` reports it: without this file's frame.
        traceback = error.__traceback__.tb_next if error.__traceback__ else None
        sys.excepthook(type(error), error.with_traceback(traceback), traceback)
        sys.exit(1)


