"""A code edit whose answer repeats the input: another function, another edit, each round."""
from workloads import Instance, Workload

ASK = "{edit} Reply with the full updated code only.\n\n```python\n{code}```"

FUNCTIONS = [
    ("Rename the function parse_order to read_order everywhere in this code.", '''def parse_order(line):
    fields = line.strip().split(";")
    order_id = int(fields[0])
    customer = fields[1].title()
    amount = float(fields[2])
    if amount < 0:
        raise ValueError(f"negative amount in order {order_id}")
    return {"id": order_id, "customer": customer, "amount": amount}


def parse_orders(lines):
    return [parse_order(line) for line in lines if line.strip()]
'''),
    ("Rename the variable readings to samples in this function.", '''def moving_average(readings, window=3):
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    for i in range(len(readings) - window + 1):
        chunk = readings[i:i + window]
        averages.append(sum(chunk) / window)
    return averages
'''),
    ("Change the default timeout from 10 to 30 seconds in this class.", '''import time


class RetryPolicy:
    def __init__(self, attempts=3, timeout=10):
        self.attempts = attempts
        self.timeout = timeout

    def run(self, action):
        last_error = None
        for attempt in range(self.attempts):
            try:
                return action(timeout=self.timeout)
            except TimeoutError as error:
                last_error = error
                time.sleep(2 ** attempt)
        raise last_error
'''),
    ("Rename the class Inventory to Stock everywhere in this code.", '''class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count=1):
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count=1):
        if self.items.get(name, 0) < count:
            raise KeyError(f"not enough {name} in stock")
        self.items[name] -= count


def restock(inventory, names):
    for name in names:
        inventory.add(name, 10)
'''),
    ("Make the function word_counts ignore case (lower-case every word) and return the updated code.", '''import re


def word_counts(text):
    counts = {}
    for word in re.findall(r"[A-Za-z']+", text):
        counts[word] = counts.get(word, 0) + 1
    return counts


def top_words(text, n=5):
    counts = word_counts(text)
    return sorted(counts.items(), key=lambda kv: -kv[1])[:n]
'''),
    ("Rename the parameter path to filename in this function.", '''import json


def load_settings(path, defaults=None):
    settings = dict(defaults or {})
    try:
        with open(path, encoding="utf-8") as handle:
            settings.update(json.load(handle))
    except FileNotFoundError:
        pass
    return settings
'''),
    ("Add a parameter currency with the default \"EUR\" to format_price and use it instead of the fixed \"EUR\".", '''def format_price(amount):
    whole = int(amount)
    cents = round((amount - whole) * 100)
    return f"{whole}.{cents:02d} EUR"


def format_invoice(lines):
    total = sum(price for _, price in lines)
    rows = [f"{name}: {format_price(price)}" for name, price in lines]
    rows.append(f"Total: {format_price(total)}")
    return "\\n".join(rows)
'''),
    ("Rename the function distance to euclidean_distance everywhere in this code.", '''import math


def distance(a, b):
    return math.sqrt((a[0] - b[0]) ** 2 + (a[1] - b[1]) ** 2)


def closest(point, others):
    best, best_d = None, float("inf")
    for other in others:
        d = distance(point, other)
        if d < best_d:
            best, best_d = other, d
    return best
'''),
]

WORKLOAD = Workload(
    name="code-edit", kind="input", tokens=192, quick_tokens=64, order=10,
    describe="edit a function and reply with the whole updated code (another function each round)",
    pool=[Instance([ASK.format(edit=edit, code=code)]) for edit, code in FUNCTIONS])
