"""A code agent's steps run in sqbox with `sqbox.integrations.smolagents.SqboxExecutor`.

With smolagents installed, hand the executor to an agent:
`CodeAgent(tools=[...], model=model, executor=SqboxExecutor(image))`. Without it, this demo
drives the executor the way an agent does: variables and tools sent once, then steps.

Run the demo:  SQBOX_BIN=build/sqbox python3 python/examples/smolagents_executor.py [IMAGE]
(IMAGE defaults to $SQBOX_PYTHON_IMAGE).
"""
import os
import sys

from sqbox.integrations.smolagents import SqboxExecutor


def get_weather(city: str) -> str:
    """A host-side tool: in a real agent it would call an API the sandbox cannot reach."""
    return f"Sunny in {city}, 21 °C"


def demo(image: str) -> None:
    with SqboxExecutor(image, timeout=10) as executor:
        executor.send_variables({"numbers": [1, 2, 3, 4, 5]})
        executor.send_tools({"get_weather": get_weather})
        steps = [
            "total = sum(numbers)\nprint('total is', total)",
            "report = get_weather('Paris')\nprint(report)\nlen(report)",
            "final_answer(total * 2)",
        ]
        for step in steps:
            result = executor(step)
            print(f"step output={result.output!r} logs={result.logs!r}")
            if result.is_final_answer:
                print(f"final answer: {result.output} (is_final_answer=True)")
                break


if __name__ == "__main__":
    image_path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SQBOX_PYTHON_IMAGE")
    if not image_path:
        sys.exit("usage: smolagents_executor.py IMAGE (or set $SQBOX_PYTHON_IMAGE)")
    demo(image_path)
