"""Convert a CSV table to Markdown: another table each round (made from a seeded generator)."""
import random

from workloads import Instance, Workload

ASK = "Convert this CSV table to a Markdown table. Reply with the table only.\n\n{csv}"

FIRST = ["Alice", "Ben", "Chen", "Dana", "Emil", "Farah", "Goran", "Hana", "Ivan", "Jonas", "Kemal", "Lena",
         "Marta", "Nadia", "Oskar", "Priya", "Rafael", "Sofia", "Tomas", "Uma", "Viktor", "Wen", "Yusuf", "Zoe"]
LAST = ["Moreau", "Okafor", "Wei", "Cohen", "Berg", "Haddad", "Petrov", "Sato", "Novak", "Lindqvist", "Yilmaz",
        "Fischer", "Costa", "Rahman", "Nilsen", "Sharma", "Ortega", "Rossi", "Horvat", "Iyer"]
CITIES = ["Lyon", "Lagos", "Xi'an", "Haifa", "Bergen", "Beirut", "Sofia", "Osaka", "Brno", "Uppsala", "Izmir",
          "Bremen", "Porto", "Dhaka", "Tromso", "Pune", "Seville", "Turin", "Split", "Chennai"]
SCHEMAS = [
    ("name,city,age", lambda rnd: str(rnd.randint(19, 78))),
    ("name,city,salary", lambda rnd: str(rnd.randrange(28000, 96000, 500))),
    ("name,city,score", lambda rnd: f"{rnd.uniform(40, 100):.1f}"),
    ("name,city,joined", lambda rnd: f"20{rnd.randint(10, 24)}-{rnd.randint(1, 12):02d}-{rnd.randint(1, 28):02d}"),
]


def csv_table(seed):
    rnd = random.Random(seed)
    header, value = SCHEMAS[seed % len(SCHEMAS)]
    rows = [header]
    for _ in range(rnd.randint(5, 7)):
        rows.append(f"{rnd.choice(FIRST)} {rnd.choice(LAST)},{rnd.choice(CITIES)},{value(rnd)}")
    return "\n".join(rows) + "\n"


WORKLOAD = Workload(
    name="table", kind="input", tokens=192, quick_tokens=64, order=30,
    describe="convert a CSV table of 5-7 rows to Markdown (another table each round)",
    pool=[Instance([ASK.format(csv=csv_table(seed))]) for seed in range(8)])
