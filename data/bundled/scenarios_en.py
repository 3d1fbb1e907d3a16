"""English scenario templates of the bundled set. Each function fills one :class:`Session`.

Labels follow ../shared/datasets/labels/README.md; the conventions used where the guide leaves a
choice are listed in data/README.md ("Bundled project-written set").
"""

from __future__ import annotations

import datetime as dt
import random

from builder import F, I, K, R, Session, dumps
from slots import code, digits, en_date, en_day, en_name, money, num_word

# ------------------------------------------------------------------------------------------------
# travel booking: flights + hotel, budget and time constraints, a passenger-count change
# ------------------------------------------------------------------------------------------------
CITIES = [("New York", "JFK", "Times Square"), ("Seattle", "SEA", "Pike Place Market"),
          ("Chicago", "ORD", "Millennium Park"), ("Denver", "DEN", "Union Station"),
          ("Boston", "BOS", "the Public Garden"), ("Miami", "MIA", "South Beach"),
          ("San Francisco", "SFO", "Union Square"), ("Atlanta", "ATL", "Centennial Olympic Park"),
          ("Austin", "AUS", "the State Capitol"), ("Portland", "PDX", "Powell's Books")]
HOTELS = ["Harbor Lane Hotel", "The Linden", "Maple & Stone Inn", "Hotel Corvid", "Parkside Suites",
          "The Wexford", "Riverbend Lodge", "Alder House", "The Calloway", "Ninth Street Hotel"]
RELATIVES = [("sister", "she"), ("brother", "he"), ("cousin", "she"), ("colleague", "he"), ("friend", "she")]


def _hm(h: int, m: int) -> str:
    return f"{h:02d}:{m:02d}"


def travel(s: Session, rng: random.Random, v: int) -> None:
    first, last = en_name(rng)
    uid = f"{first.lower()}_{last.lower()}_{digits(rng, 4)}"
    (o_city, o_code, _), (d_city, d_code, landmark) = rng.sample(CITIES, 2)
    d1 = dt.date(2025, rng.choice([4, 5, 6, 9, 10]), rng.randint(3, 20))
    d2 = d1 + dt.timedelta(days=rng.randint(3, 6))
    nights = (d2 - d1).days
    n_old = rng.choice([2, 3])
    n_new = n_old + 1
    budget = rng.choice([650, 700, 750, 800, 900])
    earliest = rng.choice([8, 9, 10])
    early = f"{earliest % 12 or 12}am" if earliest < 12 else f"{earliest - 12}pm"
    rel, pron = rng.choice(RELATIVES)
    comp1, comp2 = en_name(rng), en_name(rng)
    companions = [f"{comp1[0]} {last}", f"{comp2[0]} {comp2[1]}", f"{en_name(rng)[0]} {last}"][: n_new - 1]
    gc = f"gift_card_{digits(rng, 7)}"
    gc_bal = rng.choice([150, 200, 250])
    last4 = digits(rng, 4)
    cc = f"credit_card_{digits(rng, 7)}"
    fl = rng.sample(range(100, 990), 7)
    f_early, f_ok1, f_ok2 = (f"SK{n}" for n in fl[:3])
    r_early, r_ok1, r_ok2 = (f"SK{n}" for n in fl[3:6])
    p_early, p_ok1, p_ok2 = round(budget * 0.27), round(budget * 0.38), round(budget * 0.33)
    q_early, q_ok1, q_ok2 = round(budget * 0.25), round(budget * 0.35), round(budget * 0.44)
    t_early, t_ok1, t_ok2 = _hm(earliest - 2, 10), _hm(earliest + 1, 40), _hm(earliest + 4, 15)
    u_early, u_ok1, u_ok2 = "06:45", "13:20", "17:05"
    pp = p_ok1 + q_ok1
    total = pp * n_new
    ref = code(rng, 6)
    hmax = rng.choice([180, 200, 220, 250])
    h1, h2, h3 = rng.sample(HOTELS, 3)
    rooms = 2
    hp3 = hmax - rng.choice([25, 35, 40])
    hotel_total = hp3 * nights * rooms
    hotel_id = f"HT-{digits(rng, 6)}"

    s.system(
        "You are the booking agent of Skyway Travel. Policy:\n"
        "- Verify the traveller's user ID before any search that uses their profile or any booking.\n"
        "- Before booking, list the flights, passengers and total price, and get an explicit yes.\n"
        "- Never exceed the budget the user states.\n"
        "- At most one gift card and one credit card per booking; gift cards are charged first.\n"
        "- Booking references have 6 characters; always give them to the user.",
        3, ["Verify the traveller's user ID before any search", "get an explicit yes",
            "Never exceed the budget the user states", "At most one gift card and one credit card per booking"])
    if v % 2 == 0:
        s.user("Hi there! Hope your day is going well.", F, 0)
        s.say("Hello! It is, thank you. How can I help with your travel plans?", F, 0)
    goal = s.user(
        f"I need a round trip from {o_city} to {d_city} for {num_word(n_old)} people, leaving {en_date(d1)} "
        f"and coming back {en_date(d2)}. Economy is fine, but the flights must stay under {money(budget)} per "
        f"person round trip, and no flights departing before {early}.",
        I, 3, [f"round trip from {o_city} to {d_city}", f"{num_word(n_old)} people", f"leaving {en_date(d1)}",
               f"coming back {en_date(d2)}", f"under {money(budget)} per person", f"no flights departing before {early}"])
    s.fact("budget", f"under {money(budget)} per person", "constraint", "What is the flight budget per person?")
    s.fact("earliest_departure", f"no flights departing before {early}", "constraint",
           "Is there a limit on how early the flights may depart?")
    s.fact("outbound_date", en_date(d1), "date", "On which date does the trip start?")
    s.say("Happy to help. Could you give me your Skyway user ID first, so I can verify your profile?", R, 0)
    s.user(f"Sure, it's {uid}.", K, 3, [uid])
    s.fact("user_id", uid, "id", "What is the traveller's user ID?")
    s.call("get_user_details", {"user_id": uid}, R, 1, [uid])
    s.tool({"user_id": uid, "name": f"{first} {last}", "membership": "silver",
            "payment_methods": [{"id": gc, "type": "gift_card", "balance": gc_bal},
                                {"id": cc, "type": "credit_card", "brand": "visa", "last_four": last4}],
            "saved_passengers": [{"name": companions[0]}]},
           K, 2, [f"{first} {last}", gc, f'"balance": {gc_bal}', cc, f'"last_four": "{last4}"'])
    s.call("search_flights", {"origin": o_code, "destination": d_code, "date": d1.isoformat(), "cabin": "economy",
                              "passengers": n_old}, R, 1, [o_code, d_code, d1.isoformat()],
           text="Thanks, you're verified. Let me search the outbound flights first.")
    s.tool([{"flight": f_early, "depart": t_early, "arrive": _hm(earliest + 1, 5), "price": p_early, "seats_left": 9},
            {"flight": f_ok1, "depart": t_ok1, "arrive": _hm(earliest + 4, 55), "price": p_ok1, "seats_left": 7},
            {"flight": f_ok2, "depart": t_ok2, "arrive": _hm(earliest + 7, 30), "price": p_ok2, "seats_left": n_old}],
           R, 1, [f_early, f_ok1, f_ok2])
    s.call("search_flights", {"origin": d_code, "destination": o_code, "date": d2.isoformat(), "cabin": "economy",
                              "passengers": n_old}, R, 1, [d_code, o_code, d2.isoformat()])
    s.tool([{"flight": r_early, "depart": u_early, "arrive": "09:50", "price": q_early, "seats_left": 4},
            {"flight": r_ok1, "depart": u_ok1, "arrive": "16:40", "price": q_ok1, "seats_left": 12},
            {"flight": r_ok2, "depart": u_ok2, "arrive": "20:25", "price": q_ok2, "seats_left": 3}],
           R, 1, [r_early, r_ok1, r_ok2])
    s.say(
        f"Here is what fits your rules. {f_early} leaves at {t_early}, before {early}, so I've ruled it out, and the "
        f"same goes for {r_early} at {u_early} on the way back. Outbound options: {f_ok2} at {t_ok2} "
        f"({money(p_ok2)}) or {f_ok1} at {t_ok1} ({money(p_ok1)}). Return: {r_ok1} at {u_ok1} ({money(q_ok1)}) "
        f"or {r_ok2} at {u_ok2} ({money(q_ok2)}). The cheapest combination is {f_ok2} + {r_ok1} at "
        f"{money(p_ok2 + q_ok1)} per person.",
        R, 1, [f"{f_ok2} + {r_ok1}", f"{money(p_ok2 + q_ok1)} per person"])
    month = d1.strftime("%B")
    s.user(f"Nice. Totally unrelated, but is {d_city} usually rainy in {month}?", F, 0)
    s.say(f"I don't have live weather data, but {month} is usually mild in {d_city}. A light jacket never hurts!", F, 0)
    corr = s.user(
        f"Oh wait, my {rel} just told me {pron} is coming too, so we're {num_word(n_new)} people now, not "
        f"{num_word(n_old)}. Same dates and the same budget per person.",
        I, 3, [f"{num_word(n_new)} people now", "Same dates and the same budget per person"])
    s.fact("passengers", f"{num_word(n_new)} people", "count", "How many people are travelling?",
           superseded=f"{num_word(n_old)} people")
    s.call("search_flights", {"origin": o_code, "destination": d_code, "date": d1.isoformat(), "cabin": "economy",
                              "passengers": n_new}, R, 1, [f'"passengers": {n_new}'],
           text=f"No problem, I'll check availability again for {num_word(n_new)} travellers.")
    s.tool([{"flight": f_early, "depart": t_early, "price": p_early, "seats_left": 9},
            {"flight": f_ok1, "depart": t_ok1, "price": p_ok1, "seats_left": 7}],
           K, 2, [f_ok1, t_ok1, f'"price": {p_ok1}'])
    s.say(
        f"With {num_word(n_new)} travellers, {f_ok2} no longer has enough seats (only {n_old} left). The best "
        f"option within your rules is now {f_ok1} out at {t_ok1} and {r_ok1} back at {u_ok1}: "
        f"{money(pp)} per person, {money(total)} in total for {n_new} passengers. Shall I book that?",
        R, 1, [f_ok1, r_ok1, f"{money(pp)} per person", f"{money(total)} in total"])
    names = ", ".join(companions[:-1]) + f" and {companions[-1]}" if len(companions) > 1 else companions[0]
    s.user(f"Yes, book {f_ok1} and {r_ok1}. The passengers are me, {names}. Use the gift card to pay.",
           I, 3, [f"book {f_ok1} and {r_ok1}", *companions, "Use the gift card"])
    s.fact("outbound_flight", f_ok1, "id", "Which outbound flight was chosen?")
    pax = [{"name": f"{first} {last}"}] + [{"name": c} for c in companions]
    book_args = {"user_id": uid, "flights": [{"flight": f_ok1, "date": d1.isoformat()},
                                             {"flight": r_ok1, "date": d2.isoformat()}],
                 "cabin": "economy", "passengers": pax}
    if v % 2 == 0:
        s.call("book_flights", {**book_args, "payments": [{"id": gc, "amount": total}]}, F, 0)
        s.tool(f"Error: gift card balance is not enough (balance {gc_bal}, requested {total})", F, 1,
               ["gift card balance is not enough"])
        s.say(f"Sorry, that failed: the gift card only has {money(gc_bal)} left, which doesn't cover the "
              f"{money(total)} total. I can charge the gift card first and put the remaining "
              f"{money(total - gc_bal)} on your Visa ending in {last4}. Is that okay?",
              F, 1, [f"{money(total - gc_bal)}", f"Visa ending in {last4}"])
        s.user(f"Yes, do that: gift card first, the rest on the card ending in {last4}.",
               I, 3, ["gift card first", f"the rest on the card ending in {last4}"])
        payments = [{"id": gc, "amount": gc_bal}, {"id": cc, "amount": total - gc_bal}]
        s.fact("payment_split", f"the rest on the card ending in {last4}", "decision",
               "How was the flight booking paid?")
    else:
        s.call("book_flights", {**book_args, "payments": [{"id": gc, "amount": gc_bal},
                                                          {"id": cc, "amount": total - gc_bal}]}, F, 0,
               text=f"The gift card holds {money(gc_bal)}, so I'll charge that first and the rest to your card.")
        s.tool("Error: date_of_birth is required for every passenger on international-partner flights", F, 1,
               ["date_of_birth is required for every passenger"])
        s.say("Apologies, the airline rejected the booking because it needs a date of birth for every "
              "passenger. Could you give me the dates of birth?", F, 1, ["date of birth for every passenger"])
        dobs = [f"{rng.randint(1960, 2004)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}" for _ in range(n_new)]
        s.user("Sure: " + "; ".join(f"{p['name']} {d}" for p, d in zip(pax, dobs, strict=True)) + ".",
               K, 3, dobs)
        s.fact("dob_lead", dobs[0], "date", f"What is {first} {last}'s date of birth?")
        pax = [{**p, "date_of_birth": d} for p, d in zip(pax, dobs, strict=True)]
        payments = [{"id": gc, "amount": gc_bal}, {"id": cc, "amount": total - gc_bal}]
    s.call("book_flights", {**book_args, "passengers": pax, "payments": payments}, K, 2,
           [f_ok1, r_ok1, gc, cc])
    s.tool({"reservation_id": ref, "status": "confirmed", "flights": [f_ok1, r_ok1], "passengers": len(pax),
            "total": total, "payments": payments}, K, 3, [ref, '"status": "confirmed"', f'"total": {total}'])
    s.fact("reservation", ref, "id", "What is the flight booking reference?")
    s.say(f"Done! Your flights are booked under reservation {ref}: {f_ok1} on {en_date(d1)} at {t_ok1} and "
          f"{r_ok1} on {en_date(d2)} at {u_ok1}, {n_new} passengers, {money(total)} in total "
          f"({money(gc_bal)} from the gift card, {money(total - gc_bal)} on the card ending in {last4}).",
          K, 3, [f"reservation {ref}", f_ok1, r_ok1, f"{money(total)} in total"])
    s.fact("flight_total", money(total), "amount", "How much did the flights cost in total?")
    if v in (1, 2):
        s.user("Can we sit together? A window seat for me if possible.", I, 2, ["sit together", "window seat"])
        row = rng.randint(12, 31)
        seats = [f"{row}{c}" for c in "ABCD"[:n_new]]
        s.call("assign_seats", {"reservation_id": ref, "seats": seats}, K, 1, [ref] + seats[:2])
        s.tool({"reservation_id": ref, "seats": {p["name"]: st for p, st in zip(pax, seats, strict=True)}},
               K, 2, seats)
        s.say(f"Seats assigned on both flights: you're in {seats[0]} by the window, and the others are in "
              f"{', '.join(seats[1:])} next to you.", K, 2, [seats[0]])
    s.user(f"Great. Now I need a hotel in {d_city} for the same nights, close to {landmark}. Max {money(hmax)} a "
           f"night per room, and it must have free cancellation.",
           I, 3, [f"hotel in {d_city}", f"close to {landmark}", f"Max {money(hmax)} a night", "must have free cancellation"])
    s.fact("hotel_max", f"Max {money(hmax)} a night", "constraint", "What is the nightly limit for the hotel?")
    s.call("search_hotels", {"city": d_city, "check_in": d1.isoformat(), "check_out": d2.isoformat(),
                             "near": landmark, "rooms": rooms}, R, 1, [d1.isoformat(), d2.isoformat()])
    s.tool([{"hotel": h1, "price_per_night": hmax - 20, "free_cancellation": False, "distance_km": 0.3},
            {"hotel": h2, "price_per_night": hmax + 45, "free_cancellation": True, "distance_km": 0.2},
            {"hotel": h3, "price_per_night": hp3, "free_cancellation": True, "distance_km": 0.6}],
           K, 2, [h3, f'"price_per_night": {hp3}'])
    s.say(f"{h1} is close but non-refundable, and {h2} is over your limit at {money(hmax + 45)}. {h3} is "
          f"{money(hp3)} a night with free cancellation, 0.6 km from {landmark}. For {n_new} people I'd suggest "
          f"two rooms: {money(hotel_total)} for {nights} nights.", R, 1, [h3, f"{money(hp3)} a night", money(hotel_total)])
    s.user(f"Go with {h3}, two rooms.", I, 3, [h3, "two rooms"])
    s.call("book_hotel", {"user_id": uid, "hotel": h3, "check_in": d1.isoformat(), "check_out": d2.isoformat(),
                          "rooms": rooms, "payment_id": cc}, K, 2, [h3, cc])
    s.tool({"booking_id": hotel_id, "hotel": h3, "nights": nights, "rooms": rooms, "total": hotel_total,
            "cancellation": "free until 48 hours before check-in"}, K, 3,
           [hotel_id, f'"total": {hotel_total}', "free until 48 hours before check-in"])
    s.fact("hotel_booking", hotel_id, "id", "What is the hotel booking ID?")
    s.fact("hotel_name", h3, "name", "Which hotel was booked?")
    s.say(f"Booked: {h3}, two rooms from {en_day(d1)} to {en_day(d2)}, booking {hotel_id}, {money(hotel_total)} "
          f"charged to the card ending in {last4}. Cancellation is free until 48 hours before check-in.",
          K, 3, [h3, hotel_id, money(hotel_total)])
    if v in (0, 3):
        s.user("Could you also get us a rental car at the airport?", F, 0)
        s.say("Sure. Which days do you need it, and what size of car?", R, 0)
        s.user("Actually, never mind the car. We'll take the airport train.", I, 2, ["never mind the car"])
        s.fact("no_car", "never mind the car", "decision", "Does the user want a rental car?")
        s.say("No problem, no car then.", F, 0)
    else:
        s.user("What's the check-in time at the hotel?", I, 1, ["check-in time"])
        s.call("get_hotel_info", {"booking_id": hotel_id}, R, 1, [hotel_id])
        s.tool({"check_in_from": "15:00", "check_out_until": "11:00", "breakfast": "not included"}, K, 1,
               ['"check_in_from": "15:00"'])
        s.say("Check-in is from 15:00 and check-out by 11:00. Breakfast is not included.", K, 1, ["from 15:00"])
    s.user("That's all, thanks a lot!", F, 0)
    s.say(f"You're welcome, {first}. Have a great trip to {d_city}!", F, 0)
    _ = goal, corr
