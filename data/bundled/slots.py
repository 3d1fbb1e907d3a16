"""Slot pools and formatting helpers shared by the scenario templates (standard library only).

All values are invented for this project: names, IDs, addresses, amounts and companies do not refer
to real people or records.
"""

from __future__ import annotations

import datetime as dt
import random
import string

EN_FIRST = ["Maya", "Daniel", "Priya", "Lucas", "Hannah", "Omar", "Grace", "Ethan", "Sofia", "Noah",
            "Chloe", "Ravi", "Isabel", "Marcus", "Lena", "Tobias", "Amara", "Felix", "Nora", "Julian"]
EN_LAST = ["Patel", "Okafor", "Nguyen", "Fischer", "Moreau", "Kowalski", "Tanaka", "Brennan", "Alvarez",
           "Lindqvist", "Haddad", "Rossi", "Whitaker", "Ibrahim", "Carter", "Novak", "Sato", "Delgado"]
ZH_SURNAME = ["王", "李", "张", "刘", "陈", "杨", "赵", "黄", "周", "吴", "徐", "孙", "马", "朱", "胡", "郭", "林", "何"]
ZH_GIVEN = ["伟", "静", "磊", "敏", "洋", "婷", "杰", "芳", "涛", "丽", "晨", "欣怡", "子轩", "雨桐", "浩然",
            "思远", "梓涵", "嘉怡", "宇航", "佳琪", "一鸣", "晓峰", "文博", "若曦"]

EN_WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
ZH_WEEKDAYS = ["周一", "周二", "周三", "周四", "周五", "周六", "周日"]
EN_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
             "October", "November", "December"]


def en_name(rng: random.Random) -> tuple[str, str]:
    """A (first, last) English name."""
    return rng.choice(EN_FIRST), rng.choice(EN_LAST)


def zh_name(rng: random.Random, exclude: tuple[str, ...] = ()) -> str:
    """A Chinese full name (surname + given name) not in ``exclude``."""
    while True:
        name = rng.choice(ZH_SURNAME) + rng.choice(ZH_GIVEN)
        if name not in exclude:
            return name


def code(rng: random.Random, n: int, alphabet: str = string.ascii_uppercase + string.digits) -> str:
    """A random code of ``n`` characters (booking references, order numbers)."""
    return "".join(rng.choice(alphabet) for _ in range(n))


def digits(rng: random.Random, n: int) -> str:
    """``n`` random digits, the first one not zero."""
    return str(rng.randint(1, 9)) + "".join(rng.choice(string.digits) for _ in range(n - 1))


def date_in(rng: random.Random, year: int, months: tuple[int, int], weekday: int | None = None) -> dt.date:
    """A date in ``year`` between the given months (inclusive), optionally on a given weekday (0 = Monday)."""
    start = dt.date(year, months[0], 1)
    end = dt.date(year, months[1], 28)
    day = start + dt.timedelta(days=rng.randint(0, (end - start).days))
    if weekday is not None:
        day += dt.timedelta(days=(weekday - day.weekday()) % 7)
    return day


def en_date(d: dt.date) -> str:
    """``May 14``."""
    return f"{EN_MONTHS[d.month - 1]} {d.day}"


def en_day(d: dt.date) -> str:
    """``Friday, May 16``."""
    return f"{EN_WEEKDAYS[d.weekday()]}, {en_date(d)}"


def zh_date(d: dt.date) -> str:
    """``5月14日``."""
    return f"{d.month}月{d.day}日"


def zh_day(d: dt.date) -> str:
    """``5月16日（周五）``."""
    return f"{zh_date(d)}（{ZH_WEEKDAYS[d.weekday()]}）"


def money(x: float, cents: bool = False) -> str:
    """``$1,248`` or ``$1,248.50``."""
    return f"${x:,.2f}" if cents else f"${x:,.0f}"


def num_word(n: int) -> str:
    """English number word for small counts (two .. twelve)."""
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]
    return words[n]


def zh_num(n: int) -> str:
    """Chinese number word for small counts (两 for 2, as used with measure words)."""
    words = ["零", "一", "两", "三", "四", "五", "六", "七", "八", "九", "十", "十一", "十二"]
    return words[n]
