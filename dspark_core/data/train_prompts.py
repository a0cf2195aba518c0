"""Training prompts for self-distillation, written by the project (no downloaded data sets).

Four domains: math word problems (templates with random values), code tasks (names and docstrings
of standard-library functions, plus programming exercises), open chat / instruction following
(topic x task templates) and long-input tasks (summarise, extract, rewrite passages built from
standard-library documentation and synthetic notes).

Every template here is for TRAINING only. Evaluation prompts come from separate files
(``data/prompts/*.jsonl`` other than ``train.jsonl``) and never reuse these templates; a test
checks that no evaluation prompt equals or nearly equals a training prompt.

Regenerate with ``dspark data prompts`` (fixed seed; standard-library docstrings depend on the
Python version, so the committed file records the version that wrote it).
"""

from __future__ import annotations

import importlib
import inspect
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

from ..core.paths import PROMPT_DIR

TRAIN_PROMPTS = PROMPT_DIR / "train.jsonl"
DEFAULT_COUNTS = {"math": 1500, "code": 1500, "chat": 1200, "long-input": 800}

NAMES = ["Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kira", "Leo", "Maya",
         "Nikhil", "Olga", "Pablo", "Quinn", "Rosa", "Sami", "Tariq", "Uma", "Victor", "Wen", "Yusuf", "Zoe"]
ITEMS = ["apples", "marbles", "stickers", "books", "coins", "pencils", "cookies", "stamps", "shells", "cards"]
PLACES = ["Lisbon", "Osaka", "Nairobi", "Lima", "Oslo", "Hanoi", "Quebec", "Perth", "Tunis", "Krakow"]


# ----------------------------------------------------------------------------------------- math
def _math(rng: random.Random) -> str:
    name, other = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    a, b, c = rng.randint(12, 90), rng.randint(2, 40), rng.randint(1, 11)
    templates = [
        f"{name} has {a} {item}. {name} buys {b} more and gives {c} away to {other}. How many {item} does {name} have now?",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
        f"{name} reads {b} pages a day. How many days does it take to finish a book of {a * 7} pages?",
        f"What is {rng.choice([5, 10, 12, 15, 20, 25, 30, 40, 75])}% of {a * 4}? Show the calculation.",
        f"A car uses {rng.randint(4, 12)} litres of fuel per 100 km. How much fuel does it need for {a * 10} km?",
        f"If {c + 1} workers paint a fence in {b} hours, how long would {c + 3} workers take at the same rate?",
        f"Compute {a} * {b} - {c * 3} step by step.",
        f"The sum of two numbers is {a + b} and their difference is {a - b if a > b else b - a}. Find both numbers.",
        f"A shop reduces the price of a {a}-dollar jacket by {rng.choice([10, 15, 20, 25, 30])}%. What is the new price?",
        f"Find the mean, the median and the range of these numbers: {', '.join(str(rng.randint(1, 60)) for _ in range(rng.randint(5, 9)))}.",
        f"A recipe needs {a * 5} grams of flour for {b} pancakes. How much flour is needed for {b * c} pancakes?",
        f"{name} saves {b} dollars every week. After how many weeks will {name} have at least {a * 9} dollars?",
        f"Convert {a * 7 + c} minutes into hours and minutes.",
        f"A tank holds {a * 20} litres and fills at {b} litres per minute. How long until it is half full?",
        f"Is {rng.randint(20, 400)} a prime number? Explain how you checked.",
        f"{name} and {other} share {a * 3} {item} in the ratio {c}:{c + 2}. How many does each get?",
        f"A train leaves at 08:{rng.randint(10, 59)} and the trip takes {b + 30} minutes. When does it arrive?",
        f"What is the least common multiple of {b} and {c + 4}? And their greatest common divisor?",
        f"A bag has {c + 2} red and {b} blue balls. What is the probability of drawing a red ball?",
        f"{name} runs {c + 2} km on Monday and {b % 9 + 3} km more each following day. How far has {name} run after five days?",
        f"Solve the system: x + y = {a}, x - y = {c * 2}.",
        f"A square garden has a perimeter of {4 * b} metres. What is its area?",
        f"Round {a}.{rng.randint(100, 999)} to one decimal place and to the nearest ten.",
        f"A phone plan costs {b} dollars a month plus {c} cents per text. What is the bill for {a * 3} texts?",
    ]
    return rng.choice(templates)


# ----------------------------------------------------------------------------------------- code
STDLIB_MODULES = ["string", "textwrap", "itertools", "functools", "collections", "heapq", "bisect", "statistics",
                  "math", "random", "json", "re", "os.path", "shutil", "fnmatch", "difflib", "calendar", "datetime",
                  "operator", "copy", "pprint", "base64", "hashlib", "zlib", "csv", "urllib.parse", "html", "uuid",
                  "fractions", "decimal", "glob", "tempfile", "secrets", "contextlib", "dataclasses", "enum"]

EXERCISES = [
    "reverses the words in a sentence", "checks whether two strings are anagrams",
    "returns the n-th Fibonacci number iteratively", "flattens a nested list", "counts vowels in a string",
    "merges two sorted lists into one sorted list", "removes duplicates from a list while keeping order",
    "computes the factorial of n", "finds the second largest number in a list", "converts Celsius to Fahrenheit",
    "checks whether a year is a leap year", "groups words by their first letter", "rotates a list by k positions",
    "returns the longest common prefix of a list of strings", "validates a simple email address",
    "computes a running average of a list", "transposes a matrix given as a list of lists",
    "finds all pairs in a list that sum to a target", "counts word frequencies in a text",
    "implements binary search on a sorted list", "converts a Roman numeral to an integer",
    "chunks a list into pieces of size n", "parses 'key=value' lines into a dictionary",
    "returns the prime factors of a number", "formats a number of seconds as HH:MM:SS",
    "capitalises the first letter of every sentence", "finds the most common element in a list",
    "checks whether brackets in a string are balanced", "computes the dot product of two vectors",
    "generates all subsets of a small list",
]
EXERCISE_STYLES = ["", " Add type hints.", " Include a docstring.", " Add two example calls.",
                   " Use a loop, not recursion.", " Explain the time complexity.", " Write it as a class method."]


def _stdlib_functions() -> list[tuple[str, str]]:
    """(qualified name, first paragraph of docstring) for public documented stdlib callables."""
    found = []
    for module_name in STDLIB_MODULES:
        module = importlib.import_module(module_name)
        for attr in sorted(dir(module)):
            obj = getattr(module, attr)
            if attr.startswith("_") or not callable(obj):
                continue
            doc = inspect.getdoc(obj) or ""
            first = doc.split("\n\n")[0].strip()
            if 30 <= len(first) <= 600:
                found.append((f"{module_name}.{attr}", first))
    return found


def _code(rng: random.Random, functions: list[tuple[str, str]]) -> str:
    if rng.random() < 0.35:
        return f"Write a Python function that {rng.choice(EXERCISES)}.{rng.choice(EXERCISE_STYLES)}"
    qual, doc = rng.choice(functions)
    templates = [
        f"Explain what the Python function `{qual}` does and show a short example.\n\nIts documentation says:\n{doc}",
        f"Write your own Python function that behaves like `{qual}`, described as follows:\n{doc}",
        f"Write three pytest test cases for `{qual}`.",
        f"What are common mistakes people make when using `{qual}`?",
        f"Show how to use `{qual}` in a small script that solves a realistic task.",
        f"Here is the documentation of `{qual}`:\n{doc}\n\nRewrite it as a clear, beginner-friendly explanation.",
    ]
    return rng.choice(templates)


# ----------------------------------------------------------------------------------------- chat
TOPICS = ["learning a new language", "keeping a houseplant alive", "saving money on groceries", "starting to run",
          "writing a cover letter", "planning a birthday party", "reducing screen time", "cooking rice",
          "preparing for a job interview", "organising a small office", "learning to play guitar",
          "travelling on a budget", "taking better photos with a phone", "making friends in a new city",
          "the water cycle", "how vaccines work", "the history of the printing press", "black holes",
          "photosynthesis", "the stock market", "renewable energy", "the Roman empire", "machine learning",
          "volcanoes", "the human heart", "recycling plastic", "time zones", "the moon's phases",
          "bees and pollination", "public speaking", "writing a short story", "meditation", "chess openings",
          "choosing a laptop", "composting at home", "negotiating a salary", "learning to swim", "sourdough bread",
          "the internet's origins", "climate change", "electric cars", "the immune system", "camping safety",
          "first aid for small cuts", "note-taking", "budgeting for students", "birdwatching", "board games"]
CHAT_TASKS = ["Give me three practical tips on {t}.", "Explain {t} to a ten-year-old.",
              "What are the most common misconceptions about {t}?", "Write a short poem about {t}.",
              "I want to get better at {t}. Where should I start?", "Summarise the key ideas of {t} in five bullets.",
              "Write a friendly message to a friend encouraging them about {t}.",
              "What questions should I ask an expert on {t}?", "Compare two different approaches to {t}.",
              "Write a two-paragraph blog introduction about {t}.", "Give a step-by-step plan for {t} over one week.",
              "Tell me three surprising facts about {t}.", "Write a short dialogue between two people discussing {t}.",
              "What are the pros and cons of {t}?", "Create a short quiz with answers about {t}."]
TONES = ["", " Keep it brief.", " Use a warm tone.", " Answer in a numbered list.", " Avoid jargon."]


def _chat(rng: random.Random) -> str:
    return rng.choice(CHAT_TASKS).format(t=rng.choice(TOPICS)) + rng.choice(TONES)


# ------------------------------------------------------------------------------------ long input
LONG_TASKS = ["Summarise the following text in three bullet points.", "Extract every name of a function, class or "
              "option mentioned in this text, as a list.", "Rewrite the following text in simpler words for a "
              "beginner.", "List the key facts from this text as short sentences.", "Write a one-paragraph "
              "summary of the text below, then a one-sentence title.", "Turn the following text into a "
              "question-and-answer list with four questions."]


def _module_docs() -> list[str]:
    docs = []
    for module_name in STDLIB_MODULES + ["argparse", "logging", "sqlite3", "subprocess", "threading", "pathlib",
                                         "unittest", "email", "http", "asyncio", "typing", "zipfile", "pickle"]:
        doc = inspect.getdoc(importlib.import_module(module_name)) or ""
        if len(doc) >= 400:
            docs.append(doc[:2500])
    return docs


def _synthetic_notes(rng: random.Random) -> str:
    people = rng.sample(NAMES, 4)
    city = rng.choice(PLACES)
    facts = [
        f"{people[0]} opened the meeting in the {city} office and reviewed last month's numbers.",
        f"Sales rose by {rng.randint(2, 30)} percent, mostly from the new {rng.choice(['mobile', 'web', 'retail'])} channel.",
        f"{people[1]} reported that the supplier delayed {rng.randint(2, 9)} shipments because of a strike.",
        f"The team agreed to move the product review to the {rng.randint(2, 28)}th.",
        f"{people[2]} will prepare a budget draft of {rng.randint(10, 90)} thousand dollars for the next quarter.",
        "Customers asked for a dark mode and for faster support replies.",
        f"{people[3]} suggested hiring two interns for the summer to help with testing.",
        f"The office in {rng.choice(PLACES)} will close for renovation for {rng.randint(1, 6)} weeks.",
        "Everyone must finish the security training before the end of the month.",
        f"{people[0]} closed the meeting and asked {people[1]} to send the notes by Friday.",
    ]
    rng.shuffle(facts)
    return "Meeting notes.\n" + " ".join(facts[: rng.randint(6, 10)])


def _long_input(rng: random.Random, docs: list[str]) -> str:
    passage = rng.choice(docs) if rng.random() < 0.6 else _synthetic_notes(rng)
    return f"{rng.choice(LONG_TASKS)}\n\n{passage}"


# -------------------------------------------------------------------------------------- assembly
def generate_train_prompts(counts: dict[str, int] | None = None, seed: int = 1234) -> list[dict]:
    """Unique training prompts per domain, deterministic for a given seed and Python version."""
    counts = counts or DEFAULT_COUNTS
    rng = random.Random(seed)
    functions, docs = _stdlib_functions(), _module_docs()
    makers: dict[str, Callable[[], str]] = {
        "math": lambda: _math(rng),
        "code": lambda: _code(rng, functions),
        "chat": lambda: _chat(rng),
        "long-input": lambda: _long_input(rng, docs),
    }
    records = []
    for domain, count in counts.items():
        seen: set[str] = set()
        for _ in range(count * 50):
            if len(seen) == count:
                break
            text = makers[domain]()
            if text not in seen:
                seen.add(text)
                records.append({"id": f"train-{domain}-{len(seen):05d}", "domain": domain, "turns": [text]})
        if len(seen) < count:
            raise RuntimeError(f"only {len(seen)} unique {domain} prompts could be made; lower the count")
    return records


def write_prompt_set(records: list[dict], path: Path = TRAIN_PROMPTS) -> Path:
    """Write the records as JSONL, and beside them ``<name>.meta.json`` with the Python version that made them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    meta = {"python": python_version(), "command": "dspark data prompts", "counts": DEFAULT_COUNTS}
    meta_path(path).write_text(json.dumps(meta, indent=1) + "\n")
    return path


def meta_path(path: Path) -> Path:
    return path.with_name(path.stem + ".meta.json")


def python_version() -> str:
    return sys.version.split()[0]
