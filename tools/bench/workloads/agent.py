"""An agent's session: a code edit, then a second turn that edits the previous answer.

The first turn is asked unmeasured (both sides keep what they saw); the measured turn
is the second, whose prompt holds the first answer (plain decoding's, the same text for
every configuration) and asks for it again with another change.
"""
from workloads import Instance, Workload

FIRST = "{edit} Reply with the full updated code only.\n\n```python\n{code}```"
SECOND = "{edit} Reply with the full updated code only."

SESSIONS = [
    ("Rename the function celsius_to_fahrenheit to to_fahrenheit everywhere in this code.",
     "Now rename the parameter readings to temperatures in your code above.", '''def celsius_to_fahrenheit(c):
    return c * 9 / 5 + 32


def convert_all(readings):
    return [celsius_to_fahrenheit(r) for r in readings]
'''),
    ("Rename the variable result to lines in this function.",
     "Now change the separator from \", \" to \"; \" in your code above.", '''def format_table(rows):
    result = []
    for row in rows:
        result.append(", ".join(str(cell) for cell in row))
    return "\\n".join(result)
'''),
    ("Change the maximum length from 80 to 100 in this function.",
     "Now rename the function wrap_text to wrap_paragraph in your code above.", '''def wrap_text(text, width=80):
    words = text.split()
    lines, current = [], ""
    for word in words:
        if len(current) + len(word) + 1 > width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}".strip()
    lines.append(current)
    return lines
'''),
    ("Rename the class Counter to Tally everywhere in this code.",
     "Now rename the method increment to add in your code above.", '''class Counter:
    def __init__(self):
        self.value = 0

    def increment(self, step=1):
        self.value += step
        return self.value

    def reset(self):
        self.value = 0
'''),
    ("Rename the function is_valid_email to looks_like_email everywhere in this code.",
     "Now rename the parameter address to text in your code above.", '''import re

PATTERN = re.compile(r"^[^@\\s]+@[^@\\s]+\\.[a-z]+$")


def is_valid_email(address):
    return bool(PATTERN.match(address.strip().lower()))


def valid_emails(addresses):
    return [a for a in addresses if is_valid_email(a)]
'''),
    ("Rename the variable seen to visited in this function.",
     "Now rename the function unique_items to dedupe in your code above.", '''def unique_items(items):
    seen = set()
    out = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out
'''),
    ("Change the discount from 0.1 to 0.15 in this function.",
     "Now rename the function apply_discount to discounted in your code above.", '''def apply_discount(prices, discount=0.1):
    if not 0 <= discount < 1:
        raise ValueError("discount must be between 0 and 1")
    return [round(p * (1 - discount), 2) for p in prices]
'''),
    ("Rename the function read_csv_rows to load_rows everywhere in this code.",
     "Now rename the parameter delimiter to sep in your code above.", '''import csv


def read_csv_rows(path, delimiter=","):
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.reader(handle, delimiter=delimiter))


def column(path, index):
    return [row[index] for row in read_csv_rows(path)]
'''),
]

WORKLOAD = Workload(
    name="agent", kind="input", tokens=192, quick_tokens=64, order=60,
    describe="an agent's second turn: edit the code of the previous answer again (another session each round)",
    pool=[Instance([FIRST.format(edit=first, code=code), SECOND.format(edit=second)])
          for first, second, code in SESSIONS])
