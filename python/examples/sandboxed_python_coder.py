"""torchforge's coder actor on sqbox: `sqbox.integrations.monarch.SandboxedPythonCoder`.

Under Monarch, spawn it as an actor; without Monarch it is a plain asyncio object, as here.

Run the demo:  SQBOX_BIN=build/sqbox python3 python/examples/sandboxed_python_coder.py [IMAGE]
(IMAGE defaults to $SQBOX_PYTHON_IMAGE).
"""
import asyncio
import os
import sys

from sqbox.integrations.monarch import SandboxedPythonCoder


async def demo(image: str) -> None:
    coder = SandboxedPythonCoder(image, timeout=10)
    await coder.setup()
    try:
        out, err = await coder.execute("x = 21\nprint(x * 2)")
        print(f"stdout: {out!r} stderr: {err!r}")
        out, err = await coder.execute("print(x + 1)")  # state persists
        print(f"stdout: {out!r} (x kept)")
        out, err = await coder.execute("1 / 0")
        print("error: " + err.strip().splitlines()[-1])  # ZeroDivisionError: division by zero
        await coder.recreate()
        out, err = await coder.execute("print(x)")
        print("after recreate: " + err.strip().splitlines()[-1])  # NameError
    finally:
        await coder.close()


if __name__ == "__main__":
    image_path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SQBOX_PYTHON_IMAGE")
    if not image_path:
        sys.exit("usage: sandboxed_python_coder.py IMAGE (or set $SQBOX_PYTHON_IMAGE)")
    asyncio.run(demo(image_path))
