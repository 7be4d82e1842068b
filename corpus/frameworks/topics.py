"""Questions of the healthy runs every crew answers, and the canned search results behind them."""

from __future__ import annotations

# Healthy runs beyond the first five of each crew: other companies, some answered with two
# different searches (a general one, then a specific one that succeeds), as healthy agents do.
# (key, user question, task the manager delegates, the sub-agent's search queries, answer)
MORE_HEALTHY = [
    ("wayne", "What was Wayne Enterprises' R&D spending in 2024?",
     "Find Wayne Enterprises' R&D spending for 2024.", ["Wayne Enterprises R&D spending 2024"], "USD 1.2 billion"),
    ("stark", "How many factories does Stark Industries run in Europe?",
     "Find the number of Stark Industries factories in Europe.",
     ["Stark Industries annual report", "Stark Industries Europe plant locations"], "7 factories"),
    ("acme", "Who is the CEO of Acme Corporation?", "Find the current CEO of Acme Corporation.",
     ["Acme Corporation CEO"], "Jane Roe"),
    ("hooli", "What was Hooli's cloud revenue in the third quarter of 2024?",
     "Find Hooli's cloud revenue for the third quarter of 2024.",
     ["Hooli quarterly results Q3 2024", "Hooli cloud segment revenue"], "USD 3.4 billion"),
    ("soylent", "Which countries does Soylent sell in?", "List the countries where Soylent sells its products.",
     ["Soylent markets countries"], "the US, Canada and the UK"),
    ("tyrell", "When was Tyrell Corporation founded?", "Find the founding year of Tyrell Corporation.",
     ["Tyrell Corporation history founded"], "1982"),
]  # fmt: skip

SEARCH_RESULTS = {
    "northwind": "Northwind Traders annual report 2024: EU revenue EUR 412 million (up 6%).",
    "contoso": "Contoso 10-K: 18,250 employees as of December 31, 2023.",
    "fabrikam": "Market study 2024: Fabrikam holds 14% of the German office-furniture market.",
    "globex": "Globex revenue: USD 2.10 billion in 2023, USD 2.31 billion in 2024.",
    "initech": "Initech FY2024: operating margin 11.8%.",
    "umbrella": "Umbrella Logistics serves Madrid, Barcelona, Valencia and Seville in Spain.",
    "pizza": "Neapolitan dough: 1 kg flour, 700 ml water, 25 g salt, 2 g yeast.",
    "wayne": "Wayne Enterprises 2024 report: R&D spending USD 1.2 billion.",
    "stark annual": "Stark Industries annual report: 21 factories worldwide.",
    "stark": "Stark Industries runs 7 factories in Europe (Germany 3, Italy 2, Poland 2).",
    "acme": "Acme Corporation leadership: Jane Roe, CEO since 2022.",
    "hooli quarterly": "Hooli Q3 2024: total revenue USD 19.8 billion.",
    "hooli": "Hooli cloud segment: USD 3.4 billion revenue in Q3 2024.",
    "soylent": "Soylent is sold in the US, Canada and the UK.",
    "tyrell": "Tyrell Corporation was founded in 1982.",
}


def search_result(query: str) -> str:
    """The canned result of a web search for ``query`` (the first key the query mentions)."""
    lowered = query.lower()
    for key, text in SEARCH_RESULTS.items():
        if all(word in lowered for word in key.split()):
            return text
    return "No results."
