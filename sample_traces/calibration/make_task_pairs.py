"""Write task_pairs.csv, labelled pairs of delegated task statements (deterministic).

Run: python sample_traces/calibration/make_task_pairs.py
Each pair is the task statements of two invocations of one sub-agent by its manager (what
``repeated_calls`` compares for delegations and agent invocations): ``same_request`` 1 when the
second asks the same thing again in other words (another sentence built around the same request:
noun phrase or clause, question or imperative, synonyms of the verb and the measure), 0 when it
asks for something else. Hard negatives change one slot (another year, company, city, measure
...), which is what a manager making progress does ("2023, then 2024"); easy negatives are
another request to the same sub-agent. The templates were written for this file, not taken from
the framework corpus (sample_traces/frameworks), which only checks the result.
"""

import pathlib
import random

from pairs_csv import write_pairs  # the script's folder is on sys.path

HERE = pathlib.Path(__file__).resolve().parent
SEED = 20261202

# Each domain: slots, and the wordings of one request. A wording is a format string over the
# slots; slot values may have a second form (a phrase) used by some wordings ({measure_phrase}).
COMPANY = {
    "slots": {
        "company": ["Globex", "Initech", "Umbrella", "Hooli", "Soylent", "Wonka", "Stark Industries", "Acme"],
        "measure": [
            ("revenue", "how much revenue {company} made"),
            ("net profit", "how much net profit {company} made"),
            ("headcount", "how many people {company} employed"),
            ("market share", "what share of the market {company} held"),
            ("R&D spending", "how much {company} spent on R&D"),
            ("number of customers", "how many customers {company} had"),
        ],
        "year": ["2021", "2022", "2023", "2024"],
    },
    "same": [
        "Find {company}'s {measure} for {year}.",
        "Look up the {measure} of {company} in {year}.",
        "What was {company}'s {measure} in {year}?",
        "Research {measure_phrase} in {year}.",
        "Get me the {year} {measure} figure for {company}.",
        "Find out {measure_phrase} in fiscal {year}.",
        "I need {company}'s {measure} for the {year} fiscal year.",
        "Search for the {measure} that {company} reported for {year}.",
    ],
}
TRAVEL = {
    "slots": {
        "city": ["Lisbon", "Porto", "Seville", "Munich", "Dublin", "Krakow", "Vienna", "Oslo"],
        "thing": [
            ("hotels under 150 euros a night", "hotels that cost less than 150 euros per night"),
            ("direct trains from Paris", "trains that go from Paris without a change"),
            ("restaurants with vegan menus", "places to eat that serve vegan food"),
            ("coworking spaces with day passes", "coworking spaces you can use for a single day"),
            ("museums open on Mondays", "museums that open on a Monday"),
        ],
        "month": ["March", "June", "September", "December"],
    },
    "same": [
        "Find {thing} in {city} for {month}.",
        "Search for {thing} in {city} in {month}.",
        "Which {thing} does {city} have in {month}?",
        "Look for {thing_phrase} in {city} during {month}.",
        "Give me a list of {thing} in {city} for {month}.",
        "Check what {thing_phrase} there are in {city} in {month}.",
    ],
}
SOFTWARE = {
    "slots": {
        "component": ["billing service", "login page", "search API", "checkout flow", "nightly export job"],
        "problem": [
            ("the timeout errors", "why requests time out"),
            ("the memory leak", "why memory keeps growing"),
            ("the failing tests", "why the tests fail"),
            ("the slow queries", "why the queries are slow"),
        ],
        "version": ["v2.3", "v2.4", "v3.0", "v3.1"],
    },
    "same": [
        "Investigate {problem} in the {component} since {version}.",
        "Find the cause of {problem} in the {component} in {version}.",
        "Figure out {problem_phrase} in the {component} after the {version} release.",
        "Debug {problem} that the {component} has had since {version}.",
        "Look into {problem_phrase} in the {component} ({version}).",
        "Why does the {component} show {problem} since {version}? Find out.",
    ],
}
SUPPORT = {
    "slots": {
        "customer": ["Northwind", "Contoso", "Fabrikam", "Tailspin", "Litware", "Adventure Works"],
        "item": [
            ("open support tickets", "which support tickets are still open"),
            ("unpaid invoices", "which invoices have not been paid"),
            ("contract renewal date", "when the contract renews"),
            ("orders shipped late", "which orders shipped late"),
        ],
        "quarter": ["Q1", "Q2", "Q3", "Q4"],
    },
    "same": [
        "List {customer}'s {item} for {quarter}.",
        "Find the {item} of {customer} in {quarter}.",
        "Check {item_phrase} for {customer} in {quarter}.",
        "Pull up {customer}'s {item} from {quarter}.",
        "For {customer}, find out {item_phrase} in {quarter}.",
        "What are {customer}'s {item} in {quarter}?",
    ],
}
RESEARCH = {
    "slots": {
        "topic": [
            ("battery recycling", "recycling of batteries"),
            ("heat pump adoption", "how many homes adopt heat pumps"),
            ("remote work policies", "rules companies set for working from home"),
            ("urban air quality", "air quality in cities"),
        ],
        "source": ["peer-reviewed studies", "government reports", "news articles"],
        "region": ["Europe", "Japan", "Brazil", "Canada"],
    },
    "same": [
        "Summarize {source} on {topic} in {region}.",
        "Find {source} about {topic} in {region} and summarize them.",
        "Collect {source} covering {topic_phrase} in {region}.",
        "Give me a summary of the {source} on {topic} for {region}.",
        "Search {source} on {topic_phrase} in {region}.",
        "What do {source} say about {topic} in {region}?",
    ],
}
DOMAINS = {
    "company": COMPANY,
    "travel": TRAVEL,
    "software": SOFTWARE,
    "support": SUPPORT,
    "research": RESEARCH,
}
REQUESTS_PER_DOMAIN = 24
PAIRS_PER_REQUEST = 3  # of each label


def fill(template: str, slots: dict[str, object]) -> str:
    """The wording with its slots: a slot given as (name, phrase) fills {x} and {x_phrase}."""
    values: dict[str, str] = {}
    for name, value in slots.items():
        if isinstance(value, tuple):
            values[name], values[name + "_phrase"] = value
        else:
            values[name] = value
    for _ in range(2):  # a phrase may name another slot ({company} inside the measure phrase)
        values = {name: text.format(**values) for name, text in values.items()}
    return template.format(**values)


def rows():
    rng = random.Random(SEED)
    n = 0
    for domain, spec in DOMAINS.items():
        names = sorted(spec["slots"])
        seen: set[tuple[int, ...]] = set()
        while len(seen) < REQUESTS_PER_DOMAIN:
            request = tuple(rng.randrange(len(spec["slots"][name])) for name in names)
            if request in seen:
                continue
            seen.add(request)
            slots = {name: spec["slots"][name][i] for name, i in zip(names, request, strict=True)}
            wordings = [tuple(rng.sample(spec["same"], 2)) for _ in range(4 * PAIRS_PER_REQUEST)]
            for first, second in list(dict.fromkeys(wordings))[:PAIRS_PER_REQUEST]:
                n += 1
                yield [f"t{n:04d}", domain, "rewording", fill(first, slots), fill(second, slots), 1]
            # one slot changed (progress: the next item), with the same or another wording
            for changed in rng.sample(names, min(len(names), PAIRS_PER_REQUEST - 1)):
                other = dict(slots)
                other[changed] = rng.choice([v for v in spec["slots"][changed] if v != slots[changed]])
                first, second = rng.choice(spec["same"]), rng.choice(spec["same"])
                n += 1
                yield [f"t{n:04d}", domain, f"other_{changed}", fill(first, slots), fill(second, other), 0]
            # another request to the same sub-agent: every slot changed
            other = {name: rng.choice([v for v in spec["slots"][name] if v != slots[name]]) for name in names}
            n += 1
            yield [
                f"t{n:04d}", domain, "other_request",
                fill(rng.choice(spec["same"]), slots), fill(rng.choice(spec["same"]), other), 0,
            ]  # fmt: skip


def main():
    write_pairs(
        HERE / "task_pairs.csv",
        ["pair_id", "domain", "kind", "first_task", "second_task", "same_request"],
        rows(),
    )


if __name__ == "__main__":
    main()
