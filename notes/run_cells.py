"""Run the {code-cell} cells of a MyST markdown file in one Python process (after the critique chapter's
setup cell), printing each cell's output and the repr of a final expression (a figure: its trace count).

    python3 notes/run_cells.py notes/critique_needle.md
"""
import ast
import re
import sys

SETUP = """
from jacap_lib import viz
from jacap_lib.results import loaders as R
from jacap_lib.experiments.protocol import rules as P
viz.setup_notebook("json")
VE = viz.evaluation
choices = R.load_eval_choices()
default, paper = choices["chosen"]["jacap"], P.PAPER_PRESET
"""


def cells(text):
    return re.findall(r"```\{code-cell\}[^\n]*\n(.*?)```", text, flags=re.S)


def run(src, env):
    tree = ast.parse(src)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), env)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), env)
        if value is not None:
            if hasattr(value, "to_plotly_json"):
                print(f"<figure: {len(value.data)} traces; title {value.layout.title.text!r}>")
            else:
                print(value)


if __name__ == "__main__":
    import pandas as pd

    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 20)
    env = {}
    exec(SETUP, env)
    for i, src in enumerate(cells(open(sys.argv[1]).read()), 1):
        print(f"----- cell {i}")
        run(src, env)
