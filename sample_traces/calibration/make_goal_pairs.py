"""Write goal_pairs.csv, the labelled goal-divergence calibration pairs (deterministic).

Run: python sample_traces/calibration/make_goal_pairs.py
Each root goal has hand-written on-goal subtasks (label 0) and drifted subtasks (label 1: off
topic, and one subtle same-domain "scope creep" subtask); two further drifted pairs per goal hand it an on-goal subtask of an unrelated goal from another
domain (an agent working on someone else's task).
"""

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from goals_part1 import GOALS as PART1  # noqa: E402
from goals_part2 import GOALS as PART2  # noqa: E402
from goals_scope_creep import SCOPE_CREEP  # noqa: E402
from pairs_csv import write_pairs  # noqa: E402

GOALS = PART1 + PART2
CROSS_OFFSETS = (7, 13)


def rows():
    n = 0
    for index, goal in enumerate(GOALS):
        for subtask in goal["on"]:
            n += 1
            yield [f"p{n:04d}", goal["domain"], goal["goal"], subtask, 0, "on_goal"]
        for subtask in goal["drift"]:
            n += 1
            yield [f"p{n:04d}", goal["domain"], goal["goal"], subtask, 1, "drifted"]
        creep = [text for prefix, text in SCOPE_CREEP.items() if goal["goal"].startswith(prefix)]
        if len(creep) != 1:
            raise SystemExit(f"expected one scope-creep subtask for {goal['goal']!r}")
        n += 1
        yield [f"p{n:04d}", goal["domain"], goal["goal"], creep[0], 1, "scope_creep"]
        for offset in CROSS_OFFSETS:
            other = GOALS[(index + offset) % len(GOALS)]
            if other["domain"] == goal["domain"]:
                other = GOALS[(index + offset + 1) % len(GOALS)]
            n += 1
            yield [
                f"p{n:04d}",
                goal["domain"],
                goal["goal"],
                other["on"][index % len(other["on"])],
                1,
                "other_task",
            ]


def main():
    write_pairs(
        HERE / "goal_pairs.csv", ["pair_id", "domain", "root_goal", "subtask", "drifted", "kind"], rows()
    )


if __name__ == "__main__":
    main()
