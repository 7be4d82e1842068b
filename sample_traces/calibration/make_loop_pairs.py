"""Write loop_pairs.csv, the labelled argument pairs that calibrate loop detection (deterministic).

Run: python sample_traces/calibration/make_loop_pairs.py
Each pair is the arguments of two calls of one tool: ``same_request`` 1 when the second call asks
for the same thing again in other words (re-ordered, question form, filler words, plural/singular,
re-typed SQL or paths), 0 when it asks for something else. The hard negatives change one slot of
the request (another year, region, city, file, table ...), which is what an agent making progress
does; easy negatives are another request of the same tool. Arguments come in the envelopes tools
are traced with: JSON (``{"query": ...}``), smolagents' ``{"args": [], "kwargs": {...}}``,
keyword arguments as parsed from a CodeAgent's code (``query="..."``) and plain text.
"""

import json
import pathlib
import random

from pairs_csv import write_pairs  # the script's folder is on sys.path

HERE = pathlib.Path(__file__).resolve().parent
SEED = 20261201

FINANCE = {
    "slots": {
        "region": ["EU", "US", "APAC", "LATAM", "UK", "Germany", "France", "Japan"],
        "metric": ["revenue", "churn", "gross margin", "headcount", "operating costs", "net profit"],
        "year": ["2021", "2022", "2023", "2024", "2025"],
    },
    "key": "query",
    "same": [
        "{region} {metric} {year}",
        "{metric} of the {region} in {year}",
        "What was the {region} {metric} in {year}?",
        "{year} {metric} for {region}",
        "{region} {metric} for the year {year}",
        "Find the {metric} of {region} in {year}",
        "show me {region} {metric} figures {year}",
        "{region} {year} {metric} numbers",
        "{metric} {region} {year}",
    ],
}
TRAVEL = {
    "slots": {
        "city": ["Paris", "Lisbon", "Berlin", "Madrid", "Rome", "Vienna", "Prague", "Oslo"],
        "thing": ["weather forecast", "hotel prices", "train times", "museum opening hours", "car rental"],
        "day": ["Monday", "Friday", "tomorrow", "next weekend", "June 3"],
    },
    "key": "query",
    "same": [
        "{city} {thing} {day}",
        "{thing} in {city} {day}",
        "What is the {thing} for {city} on {day}?",
        "{thing} {city} {day} please",
        "Look up the {city} {thing} for {day}",
        "current {thing} {city} {day}",
        "{day} {city} {thing}",
    ],
}
PRODUCTS = {
    "slots": {
        "product": [
            "iPhone 15",
            "Pixel 8",
            "Galaxy S24",
            "ThinkPad X1",
            "MacBook Air M3",
            "Kindle Paperwhite",
        ],
        "attribute": ["battery life", "price", "screen size", "weight", "release date", "reviews"],
    },
    "key": "query",
    "same": [
        "{product} {attribute}",
        "{attribute} of the {product}",
        "What is the {attribute} of the {product}?",
        "{product} {attribute} details",
        "find {product} {attribute}",
        "{attribute} {product}",
    ],
}
DELEGATION = {
    "slots": {
        "thing": ["venues", "caterers", "hotels", "photographers", "coworking spaces"],
        "city": ["Lisbon", "Porto", "Seville", "Munich", "Dublin", "Krakow"],
        "people": ["25", "40", "60", "120"],
    },
    "key": "task",
    "same": [
        "Find {thing} in {city} for {people} people",
        "Search for {thing} in {city} that can host {people} people",
        "List {city} {thing} for a group of {people} people",
        "Which {thing} in {city} can take {people} people?",
        "{thing} {city} {people} people",
        "Find {people}-people {thing} in {city}",
    ],
}
SQL = {
    "slots": {
        "column": ["revenue", "churn_rate", "margin", "orders", "refunds"],
        "table": ["q3_sales", "q4_sales", "monthly_kpis", "eu_orders"],
        "region": ["EU", "US", "APAC"],
    },
    "key": "sql",
    "same": [
        "SELECT {column} FROM {table} WHERE region = '{region}'",
        "select {column} from {table} where region = '{region}'",
        "SELECT {column}\nFROM {table}\nWHERE region='{region}'",
        "  SELECT {column} FROM {table} WHERE REGION = '{region}';",
        "SELECT t.{column} FROM {table} t WHERE t.region = '{region}'",
    ],
}
FILES = {
    "slots": {
        "package": ["billing", "auth", "search", "checkout", "reports"],
        "module": ["models", "views", "service", "utils", "client", "tests"],
    },
    "key": "path",
    "same": [
        "src/{package}/{module}.py",
        "./src/{package}/{module}.py",
        "src/{package}/{module}.py ",
        "SRC/{package}/{module}.py",
        "/repo/src/{package}/{module}.py",
    ],
}
DOMAINS = {
    "finance": FINANCE,
    "travel": TRAVEL,
    "products": PRODUCTS,
    "delegation": DELEGATION,
    "sql": SQL,
    "files": FILES,
}
REQUESTS_PER_DOMAIN = 20
PAIRS_PER_REQUEST = 3  # of each label


def envelope(rng: random.Random, key: str, text: str, style: str) -> str:
    """The arguments as a tracer records them, in one of four styles."""
    if style == "json":
        return json.dumps({key: text})
    if style == "smolagents":
        return json.dumps({"args": [], "kwargs": {key: text}, "sanitize_inputs_outputs": True})
    if style == "code":
        return f"{key}={json.dumps(text)}"
    return text


def fill(template: str, slots: dict[str, str]) -> str:
    return template.format(**slots)


def rows():
    rng = random.Random(SEED)
    n = 0
    for domain, spec in DOMAINS.items():
        names = sorted(spec["slots"])
        seen: set[tuple[str, ...]] = set()
        while len(seen) < REQUESTS_PER_DOMAIN:
            request = tuple(rng.choice(spec["slots"][name]) for name in names)
            if request in seen:
                continue
            seen.add(request)
            slots = dict(zip(names, request, strict=True))
            style = rng.choice(["json", "json", "smolagents", "code", "text"])
            wordings = [tuple(rng.sample(spec["same"], 2)) for _ in range(4 * PAIRS_PER_REQUEST)]
            for first, second in list(dict.fromkeys(wordings))[:PAIRS_PER_REQUEST]:
                a = envelope(rng, spec["key"], fill(first, slots), style)
                b = envelope(rng, spec["key"], fill(second, slots), style)
                n += 1
                yield [f"l{n:04d}", domain, "rewording", a, b, 1]
            # one slot changed (progress: the next item), with the same or another wording
            for changed in rng.sample(names, min(len(names), PAIRS_PER_REQUEST - 1)):
                other = dict(slots)
                other[changed] = rng.choice([v for v in spec["slots"][changed] if v != slots[changed]])
                first, second = rng.choice(spec["same"]), rng.choice(spec["same"])
                a = envelope(rng, spec["key"], fill(first, slots), style)
                b = envelope(rng, spec["key"], fill(second, other), style)
                n += 1
                yield [f"l{n:04d}", domain, f"other_{changed}", a, b, 0]
            # another request of the same tool: every slot changed
            other = {name: rng.choice([v for v in spec["slots"][name] if v != slots[name]]) for name in names}
            a = envelope(rng, spec["key"], fill(rng.choice(spec["same"]), slots), style)
            b = envelope(rng, spec["key"], fill(rng.choice(spec["same"]), other), style)
            n += 1
            yield [f"l{n:04d}", domain, "other_request", a, b, 0]


def main():
    write_pairs(
        HERE / "loop_pairs.csv", ["pair_id", "domain", "kind", "first", "second", "same_request"], rows()
    )


if __name__ == "__main__":
    main()
