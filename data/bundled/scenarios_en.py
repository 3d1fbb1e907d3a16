"""English scenario templates of the bundled set. Each function fills one :class:`Session`.

Labels follow ../shared/datasets/labels/README.md; the conventions used where the guide leaves a
choice are listed in data/README.md ("Bundled project-written set").
"""

from __future__ import annotations

import datetime as dt
import random

from builder import F, I, K, R, Session
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


# ------------------------------------------------------------------------------------------------
# e-commerce support: authentication, return + exchange, payment/stock failure, address with a zip fix
# ------------------------------------------------------------------------------------------------
BROKEN = [("desk lamp", "base"), ("French press", "glass carafe"), ("water bottle", "lid"),
          ("bike light", "mount"), ("ceramic planter", "rim"), ("wall clock", "glass cover")]
WEAR = ["hiking jacket", "fleece hoodie", "rain shell", "merino sweater", "trail vest"]
COLORS = ["navy", "forest green", "charcoal", "rust", "sand"]
STREETS = [("418 Alder Street", "Portland", "OR", "97205"), ("77 Quincy Avenue", "Denver", "CO", "80203"),
           ("1210 Lake Drive", "Madison", "WI", "53703"), ("9 Harbor View Road", "Salem", "MA", "01970"),
           ("305 Cedar Lane", "Austin", "TX", "78704"), ("62 Birch Court", "Raleigh", "NC", "27601")]


def ecommerce(s: Session, rng: random.Random, v: int) -> None:
    first, last = en_name(rng)
    n = rng.randint(1, 99)
    email = f"{first.lower()}.{last.lower()}{n}@example.com"
    typo = f"{first.lower()}.{last.lower()}{n}@exmaple.com"
    uid = f"{first.lower()}_{last.lower()}_{digits(rng, 4)}"
    orders = [f"#W{digits(rng, 7)}" for _ in range(3)]
    order = orders[1]
    item1, part = rng.choice(BROKEN)
    item2 = rng.choice(WEAR)
    color, color2 = rng.sample(COLORS, 2)
    size_old, size_new = rng.choice([("S", "M"), ("M", "L"), ("L", "XL")])
    id1, id2, new_id, alt_id, pid = (digits(rng, 10) for _ in range(5))
    p1 = rng.choice([39.99, 54.50, 72.00, 89.95, 64.25])
    p2 = rng.choice([119.00, 84.99, 139.50, 98.00])
    diff = 4.00
    cc = f"credit_card_{digits(rng, 7)}"
    last4 = digits(rng, 4)
    gc = f"gift_card_{digits(rng, 7)}"
    gc_bal = rng.choice([25.00, 40.00, 60.00])
    delivered = dt.date(2025, rng.choice([3, 4, 5, 6]), rng.randint(2, 25))
    label = f"RL-{code(rng, 8)}"
    (street, city, state, zip_new) = rng.choice(STREETS)
    zip_old = zip_new[:3] + zip_new[4] + zip_new[3]  # two digits swapped
    if zip_old == zip_new:
        zip_old = zip_new[:4] + str((int(zip_new[4]) + 1) % 10)

    s.system(
        "You are the customer support agent of Northwind Outfitters.\n"
        "- Authenticate the customer by email, or by full name plus zip code, before accessing any order.\n"
        "- Returns and exchanges are possible within 30 days of delivery, for delivered orders only.\n"
        "- Refunds go to the original payment method unless the customer asks for a gift card.\n"
        "- An exchange must be for the same product in another size or color; any price difference is charged.\n"
        "- List the actions and get an explicit yes before any return, exchange or address change.\n"
        "- Do not discuss products or orders of other customers.",
        3, ["Authenticate the customer by email", "within 30 days of delivery",
            "Refunds go to the original payment method", "get an explicit yes before any return, exchange or address change"])
    if v % 2 == 0:
        s.user("Hello!", F, 0)
        s.say("Hi, welcome to Northwind Outfitters support. What can I do for you today?", F, 0)
    s.user("I have a problem with an order: one thing arrived broken and another one doesn't fit. I'd like to sort "
           "both out.", I, 2, ["one thing arrived broken", "another one doesn't fit"])
    s.say("I'm sorry to hear that. Could you tell me the email address on your account so I can verify you?", R, 0)
    s.user(f"It's {typo}", F, 0)
    s.call("find_user_id_by_email", {"email": typo}, F, 0)
    s.tool("Error: user not found", F, 0)
    s.say("I couldn't find an account with that email. Could you double-check the spelling?", F, 0)
    s.user(f"Oops, typo. It's {email}.", K, 2, [email])
    s.fact("email", email, "id", "What is the customer's email address?")
    s.call("find_user_id_by_email", {"email": email}, R, 1, [email])
    s.tool(uid, K, 2, [uid])
    s.call("get_user_details", {"user_id": uid}, R, 1, [uid])
    s.tool({"user_id": uid, "name": f"{first} {last}",
            "address": {"street": "12 Old Mill Road", "city": "Springfield", "state": "IL", "zip": "62704"},
            "payment_methods": [{"id": cc, "type": "credit_card", "brand": "visa", "last_four": last4},
                                {"id": gc, "type": "gift_card", "balance": gc_bal}],
            "orders": orders}, K, 2, [uid, cc, f'"last_four": "{last4}"', gc, *orders])
    s.say(f"Thanks, {first}, you're verified. I can see three orders on your account: {', '.join(orders)}. "
          "Which one is this about?", R, 0, orders)
    s.user(f"Order {order}. The {item1} arrived with a cracked {part}, and the {item2} in size {size_old} is too "
           f"small. I want to return the {item1} for a refund to my original card, and exchange the {item2} for "
           f"size {size_new}, in {color} again.",
           I, 3, [f"Order {order}", f"return the {item1}", "refund to my original card",
                  f"exchange the {item2}", f"size {size_new}", f"in {color} again"])
    s.fact("order_id", order, "id", "Which order is the customer's problem about?")
    s.fact("refund_method", "refund to my original card", "constraint", "Where should the refund go?")
    s.call("get_order_details", {"order_id": order}, R, 1, [order])
    s.tool({"order_id": order, "status": "delivered", "delivered_on": delivered.isoformat(),
            "items": [{"item_id": id1, "name": item1, "price": p1},
                      {"item_id": id2, "name": item2, "product_id": pid, "options": {"size": size_old, "color": color},
                       "price": p2}],
            "payment_method_id": cc},
           K, 3, ['"status": "delivered"', delivered.isoformat(), id1, f'"price": {p1}', id2, pid])
    s.call("get_product_details", {"product_id": pid}, R, 1, [pid],
           text=f"The order was delivered on {en_date(delivered)}, inside the 30-day window. Let me look up the "
                f"size {size_new} variant of the {item2}.")
    s.tool({"product_id": pid, "name": item2, "variants": [
        {"item_id": new_id, "options": {"size": size_new, "color": color}, "price": p2 + diff, "available": True},
        {"item_id": alt_id, "options": {"size": size_new, "color": color2}, "price": p2 + diff, "available": True},
        {"item_id": digits(rng, 10), "options": {"size": size_old, "color": color2}, "price": p2, "available": False}]},
        K, 2, [new_id, alt_id, f'"price": {p2 + diff}'])
    s.say(f"Here's what I can do:\n1. Return the {item1} (item {id1}) and refund {money(p1, True)} to your Visa "
          f"ending in {last4}.\n2. Exchange the {item2} size {size_old} (item {id2}) for size {size_new} in {color} "
          f"(item {new_id}). The new variant costs {money(diff, True)} more, charged to the same card.\n"
          "Shall I go ahead with both?", R, 1, [money(p1, True), id1, new_id, money(diff, True)])
    s.user(f"Before that: are your {item2}s actually waterproof, or just water-resistant? Asking for a friend :)", F, 0)
    s.say("Most of our shells are water-resistant with taped seams, but I'd check the product page for the exact "
          "rating. Back to your order whenever you're ready!", F, 0)
    s.user("Ha, okay. Yes, go ahead with both.", I, 3, ["go ahead with both"])
    s.call("return_delivered_order_items", {"order_id": order, "item_ids": [id1], "payment_method_id": cc},
           K, 2, [order, id1, cc])
    s.tool({"order_id": order, "status": "return requested", "return_items": [id1], "refund_amount": p1,
            "refund_payment_method_id": cc, "return_label": label},
           K, 3, ['"status": "return requested"', f'"refund_amount": {p1}', label])
    s.fact("return_label", label, "id", "What is the return label code?")
    exch = {"order_id": order, "item_ids": [id2], "new_item_ids": [new_id], "payment_method_id": cc}
    if v % 2 == 0:
        s.call("exchange_delivered_order_items", exch, F, 0)
        s.tool(f"Error: payment method {cc} expired (03/25); a valid payment method is required for the price "
               "difference", F, 1, [f"payment method {cc} expired"])
        s.say(f"Sorry, the exchange didn't go through: your Visa ending in {last4} has expired, so it can't take "
              f"the {money(diff, True)} difference. You also have a gift card with {money(gc_bal, True)} on it. "
              "Should I use that instead?", F, 1, [f"Visa ending in {last4} has expired", money(gc_bal, True)])
        s.user("Yes, use the gift card for the difference.", I, 3, ["use the gift card for the difference"])
        s.fact("exchange_payment", "use the gift card for the difference", "decision",
               "How is the exchange price difference paid?")
        final_new = new_id
        exch = {**exch, "payment_method_id": gc}
        s.call("exchange_delivered_order_items", exch, K, 2, [order, id2, new_id, gc])
    else:
        s.call("exchange_delivered_order_items", exch, F, 0)
        s.tool(f"Error: new item {new_id} is not available", F, 1, [f"new item {new_id} is not available"])
        s.say(f"Apologies, the size {size_new} in {color} sold out a moment ago. Size {size_new} is still available "
              f"in {color2} (item {alt_id}), same price. Would that work for you?", F, 1, [color2, alt_id])
        s.user(f"Ugh. Fine, {color2} in {size_new} then.", I, 3, [f"{color2} in {size_new}"])
        s.fact("exchange_color", color2, "name", f"Which color is the replacement {item2}?", superseded=color)
        final_new = alt_id
        exch = {**exch, "new_item_ids": [alt_id]}
        s.call("exchange_delivered_order_items", exch, K, 2, [order, id2, alt_id])
    s.tool({"order_id": order, "status": "exchange requested", "exchange_items": [id2],
            "exchange_new_items": [final_new], "price_difference": diff,
            "payment_method_id": exch["payment_method_id"]},
           K, 3, ['"status": "exchange requested"', final_new, f'"price_difference": {diff}'])
    s.fact("new_item", final_new, "id", "What is the item ID of the replacement?")
    s.say(f"All set for order {order}: the return of the {item1} is registered (label {label}, print it and drop "
          f"the parcel at any carrier point), and {money(p1, True)} will be refunded to your Visa. The exchange "
          f"for the size {size_new} {item2} (item {final_new}) is registered too; the {money(diff, True)} difference "
          "has been charged.", K, 3, [label, money(p1, True), final_new])
    s.fact("refund_amount", money(p1, True), "amount", f"How much will be refunded for the {item1}?")
    s.user(f"One more thing: I've moved. Please update my default address to {street}, {city}, {state} {zip_old}.",
           I, 2, [street, city, f"{state} {zip_old}"])
    s.say(f"Sure. Just to confirm the new address: {street}, {city}, {state} {zip_old}. Is that right?", R, 0)
    s.user(f"Oh no, the zip is wrong. It's {zip_new}, not {zip_old}.", I, 3, [f"It's {zip_new}"])
    s.fact("zip", zip_new, "address", "What is the zip code of the customer's new address?", superseded=zip_old)
    s.call("modify_user_address", {"user_id": uid, "address1": street, "city": city, "state": state,
                                   "zip": zip_new, "country": "USA"}, K, 2, [street, zip_new])
    s.tool({"user_id": uid, "address": {"street": street, "city": city, "state": state, "zip": zip_new,
                                        "country": "USA"}}, K, 3, [street, f'"zip": "{zip_new}"'])
    s.say(f"Done, your default address is now {street}, {city}, {state} {zip_new}.", K, 2, [street, zip_new])
    if v in (1, 3):
        s.user("When will the refund show up on my statement?", I, 1, ["When will the refund show up"])
        s.say("Card refunds are issued as soon as the carrier scans the parcel and usually show up within 5 to 7 "
              "business days after that.", R, 1, ["5 to 7 business days"])
    s.user("Thanks, that's everything.", F, 0)
    s.say(f"You're welcome, {first}! Sorry again about the {item1}. Have a nice day.", F, 0)


# ------------------------------------------------------------------------------------------------
# coding agent: bug fix with constraints, reproduction, a first fix that breaks a test, final diff
# ------------------------------------------------------------------------------------------------
def coding(s: Session, rng: random.Random, v: int) -> None:
    from bugs import BUGS, rc

    b = BUGS[[0, 1, 2, 4][v]]
    repo, path, func, tpath, n = b["repo"], b["path"], b["func"], b["test_path"], b["n_tests"]
    test_cmd = f"python -m pytest -q {tpath}"

    def sh(command: str, cat: str, imp: int, spans: list[str] | tuple[str, ...] = (), thought: str = "") -> int:
        return s.call("bash", {"command": command}, cat, imp, spans, text=f"THOUGHT: {thought}" if thought else "")

    s.system(
        f"You are a software engineering agent working in the repository at /workspace/{repo}. Use the bash "
        "tool to run commands and the edit_file tool to change files (exact old/new strings). Start every reply "
        "with THOUGHT: and your reasoning. Make minimal changes, never edit files under tests/ unless asked, and "
        "finish by showing the final diff.",
        3, [f"/workspace/{repo}", "Make minimal changes", "never edit files under tests/", "showing the final diff"])
    s.user(
        f"Please fix this issue in {repo}:\n\n<issue>\n{b['title_en']}\n\n{b['body_en']}\n</issue>\n\n"
        f"Requirements:\n- {b['api_en']}.\n- Do not modify the existing tests.\n- The fix must still work on "
        "Python 3.9.",
        I, 3, [b["title_en"], b["api_en"], "Do not modify the existing tests", "must still work on Python 3.9"])
    s.fact("api_constraint", b["api_en"], "constraint", f"What must not change about `{func}`?")
    s.fact("python_version", "Python 3.9", "constraint", "Which Python version must the fix support?")
    sh("ls -R | head -40", R, 0, thought="Let me look at the repository layout first.")
    s.tool(rc(0, b["listing"]), R, 0)
    sh(f"grep -rn \"{func}\" --include=*.py . | head -20", R, 0, [func],
       thought=f"I'll find where `{func}` is defined and used.")
    s.tool(rc(0, b["grep"]), R, 1, [path])
    s.fact("source_path", path, "path", f"In which file is `{func}` defined?")
    sh(f"cat -n {path}", R, 0, [path], thought=f"`{func}` lives in {path}. Let me read it.")
    s.tool(rc(0, b["source"]), R, 1, [b["bug_line"]])
    sh(f"cat > reproduce.py <<'EOF'\n{b['repro']}EOF", R, 0,
       thought="Before changing anything I'll write a small script that reproduces the issue.")
    s.tool(rc(0, ""), R, 0)
    sh(b.get("repro_cmd", "python reproduce.py"), R, 0, thought="Now run it.")
    if b["repro_rc"]:
        s.tool(rc(b["repro_rc"], b["repro_bug"]), F, 1, [b["repro_bug_span"]])
    else:
        s.tool(rc(0, b["repro_bug"]), K, 2, [b["repro_bug_span"]])
    cause = s.say(f"THOUGHT: The bug is reproduced. Root cause: in {path}, `{b['bug_line']}`: {b['cause_en']}.",
                  K, 2, [path, b["bug_line"]])
    s.fact("root_cause_line", b["bug_line"], "code", "Which line caused the bug?", at=cause)
    if v % 2 == 1:
        s.user("How long do you think this will take? I have a meeting in twenty minutes.", F, 0)
        s.say("THOUGHT: It should be quick, the fix is local to one function. I'll keep going.", F, 0)
    s.user(f"One more requirement from the maintainers: {b['late_en']}; {b['late_why_en']}.",
           I, 3, [b["late_en"]])
    s.fact("late_constraint", b["late_en"], "constraint", "What extra requirement did the maintainers add?")
    if v in (0, 3):
        sh(f"pytest -q {tpath}", F, 0, thought="Noted. First a baseline run of the existing tests.")
        s.tool(rc(127, "bash: pytest: command not found\n"), F, 0, ["pytest: command not found"])
        sh(test_cmd, R, 0, thought="pytest isn't on PATH; I'll run it as a module.")
    else:
        sh(test_cmd, R, 0, thought="Noted. First a baseline run of the existing tests.")
    base = b.get("baseline_fail")
    if base:
        s.tool(rc(1, base["out"]), F, 1, [b["fail_test"], base["counts"]])
        note = (f"THOUGHT: The baseline already has one failing test, {b['fail_test']}, which covers exactly this "
                f"issue; the other tests pass. I'll fix `{func}`.")
    else:
        s.tool(rc(0, "." * n + " " * (73 - n) + "[100%]\n" + f"{n} passed in 0.03s\n"), R, 1, [f"{n} passed"])
        note = f"THOUGHT: Baseline is green. I'll fix `{func}` directly."
    old1, new1 = b["fix1"]
    s.call("edit_file", {"path": path, "old": old1, "new": new1}, F, 0, text=note)
    s.tool(f"Edited {path}: replaced 1 occurrence.", R, 0)
    sh(f"{test_cmd} && python reproduce.py", R, 0, thought="Run the tests, then the reproduction.")
    s.tool(rc(1, b["fail_out"]), F, 1, [b["fail_test"], b["fail_counts"]])
    s.say(f"THOUGHT: {b['fail_test']} fails: {b['why_en']}.", R, 1, [b["fail_test"]])
    old2, new2 = b["fix2"]
    fix = s.call("edit_file", {"path": path, "old": old2, "new": new2}, K, 2, [path],
                 text=f"THOUGHT: Corrected fix: `{b['fix2_code']}`.")
    s.fact("fix", b["fix2_code"], "code", f"What is the final fix in {path}?", at=fix)
    s.tool(f"Edited {path}: replaced 1 occurrence.", K, 1, [path])
    sh(f"{test_cmd} && python reproduce.py", R, 0, thought="Run both again.")
    fixed = b["repro_fixed"].strip()
    ok = s.tool(rc(0, "." * n + " " * (73 - n) + "[100%]\n" + f"{n} passed in 0.04s\n" + b["repro_fixed"]),
                K, 2, [f"{n} passed"] + ([fixed] if len(fixed) > 2 else []))
    s.fact("tests_passed", f"{n} passed", "count", "How many tests passed after the fix?", at=ok)
    if v % 2 == 0:
        sh(f"python3.9 -m pytest -q {tpath}", F, 0, thought="The fix must work on Python 3.9; let me check with 3.9.")
        s.tool(rc(127, "bash: python3.9: command not found\n"), F, 0, ["python3.9: command not found"])
        sh("tox -e py39 -q", R, 0, thought="No python3.9 binary on PATH; the repo has a tox config, so tox can run it.")
    else:
        sh("tox -e py39 -q", R, 0, thought="The fix must work on Python 3.9; the repo's tox config has a py39 env.")
    s.tool(rc(0, f"{n} passed in 0.05s\n  py39: OK (3.12=setup[1.71]+cmd[1.41] seconds)\n  congratulations :)\n"),
           K, 2, ["py39: OK"])
    sh("rm reproduce.py && git status --short && git diff", R, 0,
       thought="All good. Remove the reproduction script and show the diff.")
    s.tool(rc(0, f" M {path}\n{b['diff']}"), K, 3, [f" M {path}", b["fix2_code"]])
    s.say(f"THOUGHT: Done. The fix is in {path} only: {b['cause_en']}, corrected with `{b['fix2_code']}`. "
          f"The API is unchanged, no test was modified, all {n} tests pass and tox py39 is green. Also kept: "
          f"{b['late_en']}.", K, 3, [path, b["fix2_code"], f"all {n} tests pass"])
    s.user("Looks good. Can you also add a line to CHANGELOG.md under 'Unreleased'?", I, 2,
           ["add a line to CHANGELOG.md under 'Unreleased'"])
    s.call("edit_file", {"path": "CHANGELOG.md", "old": "## Unreleased\n",
                         "new": f"## Unreleased\n\n- {b['changelog_en']}\n"}, K, 1, ["CHANGELOG.md"],
           text="THOUGHT: Add the entry under the Unreleased heading.")
    s.tool("Edited CHANGELOG.md: replaced 1 occurrence.", K, 1, ["CHANGELOG.md"])
    s.say(f"THOUGHT: Added to CHANGELOG.md: \"{b['changelog_en']}\"", K, 1, ["CHANGELOG.md"])
    s.user("Thanks, merging it.", F, 0)
    s.say("THOUGHT: Nothing left to do. Glad it helped!", F, 0)


# ------------------------------------------------------------------------------------------------
# data analysis agent: SQL with a wrong column, a timeout, a currency change, read-only policy
# ------------------------------------------------------------------------------------------------
COMPANIES = [("Lumen Home", "lumen_dw"), ("Brightwater Goods", "bwg_warehouse"), ("Kestrel Outdoor", "kestrel_dw"),
             ("Orchard & Co", "orchard_dw")]
REGIONS = ["EMEA", "APAC", "AMER", "LATAM"]


def _eur(cents: int) -> str:
    return f"€{cents / 100:,.2f}"


def _usd(cents: int) -> str:
    return f"${cents / 100:,.2f}"


def _num(cents: int) -> str:
    return f"{cents // 100}.{cents % 100:02d}"


def analysis(s: Session, rng: random.Random, v: int) -> None:
    from decimal import ROUND_HALF_UP, Decimal

    company, db = COMPANIES[v % len(COMPANIES)]
    region = rng.choice(REGIONS)
    q = rng.choice([2, 3])
    months = [(2024, 3 * q - 2 + i) for i in range(3)]
    mlabels = [f"{y}-{m:02d}" for y, m in months]
    mnames = [dt.date(y, m, 1).strftime("%B") for y, m in months]
    start = dt.date(*months[0], 1)
    end = dt.date(2024, months[-1][1] + 1, 1)
    gross = [rng.randint(1_100_000, 2_600_000) * 100 + rng.randint(0, 99) for _ in months]
    refunds = [int(g * rng.uniform(0.018, 0.061)) for g in gross]
    net = [g - r for g, r in zip(gross, refunds, strict=True)]
    rates = [Decimal(f"1.{rng.randint(520, 1180):04d}") for _ in months]
    net_usd = [int((Decimal(n) * r).quantize(Decimal("1"), rounding=ROUND_HALF_UP)) for n, r in zip(net, rates, strict=True)]
    month_ends = []
    for y, m in months:
        nxt = dt.date(y + (m == 12), m % 12 + 1, 1)
        month_ends.append((nxt - dt.timedelta(days=1)).isoformat())
    n_cust = rng.randint(18_000, 64_000)

    s.system(
        f"You are a data analyst agent with read-only access to the {db} warehouse of {company} (PostgreSQL 15).\n"
        "Rules: run only SELECT queries, never INSERT, UPDATE, DELETE or DDL; exclude internal test accounts "
        "(customers.is_test = true) from every metric; report money with its currency and two decimals; always "
        "state the date range you used.",
        3, ["run only SELECT queries", "exclude internal test accounts", "customers.is_test = true",
            "report money with its currency and two decimals"])
    if v % 2 == 0:
        s.user("Morning! Hope the warehouse is in a good mood today.", F, 0)
        s.say("Good morning! Let's find out. What do you need?", F, 0)
    s.user(f"I need net revenue for {region} in Q{q} 2024, in EUR, split by month. Net means gross order value minus "
           "refunds. Only count orders with status 'completed'. It's for the board deck, so it has to be exact.",
           I, 3, [f"net revenue for {region}", f"Q{q} 2024", "in EUR", "split by month",
                  "gross order value minus refunds", "status 'completed'"])
    s.fact("period", f"Q{q} 2024", "date", "Which quarter is the analysis about?")
    s.fact("net_definition", "gross order value minus refunds", "constraint", "How is net revenue defined?")
    s.call("list_tables", {}, R, 0, text="Let me see what's in the warehouse first.")
    s.tool(["orders", "order_items", "refunds", "customers", "fx_rates", "web_sessions", "inventory_snapshots"], R, 0)
    s.call("describe_table", {"table": "orders"}, R, 0, more=[("describe_table", {"table": "refunds"})])
    s.tool([{"column": "order_id", "type": "bigint"}, {"column": "customer_id", "type": "bigint"},
            {"column": "region_code", "type": "text"}, {"column": "status", "type": "text"},
            {"column": "created_at", "type": "timestamptz"}, {"column": "gross_amount_eur", "type": "numeric(12,2)"}],
           R, 1, ["region_code", "gross_amount_eur"])
    s.tool([{"column": "refund_id", "type": "bigint"}, {"column": "order_id", "type": "bigint"},
            {"column": "amount_eur", "type": "numeric(12,2)"}, {"column": "refunded_at", "type": "timestamptz"}],
           R, 1, ["amount_eur"])
    base = (f"FROM orders o JOIN customers c ON c.customer_id = o.customer_id\n"
            f"WHERE o.status = 'completed' AND NOT c.is_test\n"
            f"  AND o.created_at >= '{start.isoformat()}' AND o.created_at < '{end.isoformat()}'\n")
    bad = ("SELECT date_trunc('month', o.created_at) AS month, sum(o.gross_amount_eur)\n"
           + base.replace("WHERE", f"WHERE region = '{region}' AND") + "GROUP BY 1 ORDER BY 1")
    s.call("run_sql", {"query": bad}, F, 0)
    s.tool(f"ERROR:  column \"region\" does not exist\nLINE 3: WHERE region = '{region}' AND o.status = 'completed' ...\n"
           "HINT:  Perhaps you meant to reference the column \"o.region_code\".", F, 1, ['column "region" does not exist'])
    good = base.replace("WHERE", f"WHERE o.region_code = '{region}' AND")
    q_gross = ("SELECT to_char(o.created_at, 'YYYY-MM') AS month, sum(o.gross_amount_eur) AS gross_eur\n"
               + good + "GROUP BY 1 ORDER BY 1")
    s.call("run_sql", {"query": q_gross}, R, 1, [f"o.region_code = '{region}'", "NOT c.is_test"],
           text="My mistake, the column is region_code.")
    s.tool([{"month": ml, "gross_eur": _num(g)} for ml, g in zip(mlabels, gross, strict=True)],
           K, 2, [_num(g) for g in gross])
    q_ref = ("SELECT to_char(o.created_at, 'YYYY-MM') AS month, sum(r.amount_eur) AS refunds_eur\n"
             + good.replace("FROM orders o", "FROM refunds r JOIN orders o ON o.order_id = r.order_id") + "GROUP BY 1 ORDER BY 1")
    s.call("run_sql", {"query": q_ref}, R, 1, ["refunds_eur"],
           text="Now the refunds, attributed to the month the order was placed so they line up with gross.")
    s.tool([{"month": ml, "refunds_eur": _num(r)} for ml, r in zip(mlabels, refunds, strict=True)],
           K, 2, [_num(r) for r in refunds])
    s.say("Attributing refunds to the order month (not the refund date) keeps each month's net consistent with its "
          "gross; refunds issued later for orders of this quarter are included, refunds for older orders are not. "
          "Net = gross - refunds per month.", R, 1, ["Attributing refunds to the order month"])
    table = "\n".join(f"| {ml} | {_eur(g)} | {_eur(r)} | {_eur(n)} |"
                      for ml, g, r, n in zip(mlabels, gross, refunds, net, strict=True))
    res = s.say(f"Net revenue, {region}, Q{q} 2024 (orders created {start.isoformat()} to {month_ends[-1]}, status "
                "completed, test accounts excluded), EUR:\n\n| month | gross | refunds | net |\n|---|---|---|---|\n"
                f"{table}\n\nTotal net: {_eur(sum(net))}.",
                K, 3, [*(_eur(n) for n in net), f"Total net: {_eur(sum(net))}"])
    s.fact("net_eur_total", _eur(sum(net)), "amount", f"What was total net revenue for {region} in EUR?", at=res)
    s.user("Perfect. Side question: do you think the new dashboard theme is too bright? Everyone's complaining.", F, 0)
    s.say("I can't see the dashboard from here, but offering a dark theme usually settles that debate!", F, 0)
    s.user("Wait, finance just told me the board deck is in USD, not EUR. Convert each month at that month's "
           "month-end rate from fx_rates.", I, 3, ["in USD, not EUR", "month-end rate from fx_rates"])
    s.fact("currency", "USD", "constraint", "In which currency must the figures be reported?", superseded="EUR")
    s.call("describe_table", {"table": "fx_rates"}, R, 0)
    s.tool([{"column": "rate_date", "type": "date"}, {"column": "base", "type": "char(3)"},
            {"column": "quote", "type": "char(3)"}, {"column": "rate", "type": "numeric(10,4)"}], R, 1, ["rate_date"])
    s.call("run_sql", {"query": "SELECT f.rate_date, f.rate FROM fx_rates f\nWHERE f.base = 'EUR' AND f.quote = 'USD'\n"
                                "  AND f.rate_date = (SELECT max(rate_date) FROM fx_rates g\n"
                                "                     WHERE date_trunc('month', g.rate_date) = date_trunc('month', f.rate_date))"},
           F, 0)
    s.tool("ERROR:  canceling statement due to statement timeout", F, 1, ["statement timeout"])
    s.call("run_sql", {"query": "SELECT rate_date, rate FROM fx_rates\nWHERE base = 'EUR' AND quote = 'USD'\n"
                                f"  AND rate_date IN ({', '.join(repr(d) for d in month_ends)})\nORDER BY rate_date"},
           R, 1, month_ends, text="The correlated subquery timed out. I'll fetch only the three month-end dates.")
    s.tool([{"rate_date": d, "rate": str(r)} for d, r in zip(month_ends, rates, strict=True)],
           K, 2, [str(r) for r in rates])
    s.fact(f"rate_{mlabels[-1]}", str(rates[-1]), "number", f"Which EUR/USD rate was used for {mnames[-1]}?")
    table = "\n".join(f"| {ml} | {_eur(n)} | {r} | {_usd(u)} |"
                      for ml, n, r, u in zip(mlabels, net, rates, net_usd, strict=True))
    res = s.say(f"Net revenue, {region}, Q{q} 2024, in USD at month-end EUR/USD rates (same filters as before):\n\n"
                f"| month | net EUR | rate | net USD |\n|---|---|---|---|\n{table}\n\nTotal net: {_usd(sum(net_usd))}.",
                K, 3, [*(_usd(u) for u in net_usd), f"Total net: {_usd(sum(net_usd))}"])
    s.fact("net_usd_total", _usd(sum(net_usd)), "amount", f"What was total net revenue for {region} in USD?", at=res)
    if v in (1, 3):
        s.user("Which month had the highest refund rate?", I, 2, ["highest refund rate"])
        rr = [r / g for r, g in zip(refunds, gross, strict=True)]
        k = rr.index(max(rr))
        s.say(f"{mnames[k]}: refunds were {rr[k] * 100:.1f}% of gross ({_eur(refunds[k])} of {_eur(gross[k])}). "
              "The other months: " + ", ".join(f"{mnames[i]} {rr[i] * 100:.1f}%" for i in range(3) if i != k) + ".",
              K, 2, [mnames[k], f"{rr[k] * 100:.1f}%"])
    s.user("And how many distinct customers placed completed orders in that quarter?", I, 2, ["distinct customers"])
    s.call("run_sql", {"query": "SELECT count(DISTINCT o.customer_id) AS customers\n" + good}, R, 1, ["count(DISTINCT o.customer_id)"])
    s.tool([{"customers": n_cust}], K, 2, [str(n_cust)])
    s.say(f"{n_cust:,} distinct customers placed completed orders in {region} in Q{q} 2024 (test accounts excluded).",
          K, 2, [f"{n_cust:,} distinct customers"])
    s.fact("customers", f"{n_cust:,}", "count", f"How many distinct customers ordered in {region} that quarter?")
    s.user("Great. Can you save the USD query as a view called finance.net_revenue_usd so finance can reuse it?",
           I, 2, ["finance.net_revenue_usd"])
    s.say("I can't create views: my access to the warehouse is read-only, and I'm only allowed to run SELECT "
          "statements. Someone with write access can create it from the gross, refunds and fx queries above; I can "
          "combine them into one statement for them if that helps.", R, 1, ["read-only"])
    s.user("Fair enough, I'll ask the data platform team. Thanks!", F, 0)
    s.say("You're welcome! Good luck with the board deck.", F, 0)


# ------------------------------------------------------------------------------------------------
# IT ops: paging alert, diagnosis, permission failure, restart, rollback window change
# ------------------------------------------------------------------------------------------------
SERVICES = ["checkout-api", "search-svc", "orders-api", "payments-gateway", "catalog-svc", "auth-svc"]


def itops(s: Session, rng: random.Random, v: int) -> None:
    svc = rng.choice(SERVICES)
    host = f"web-prod-{rng.randint(2, 19):02d}"
    db = f"pg-prod-0{rng.randint(1, 4)}"
    inc = f"INC-{digits(rng, 5)}"
    major, minor = rng.randint(2, 4), rng.randint(10, 30)
    new, prev = f"v{major}.{minor}.{rng.randint(1, 5)}", f"v{major}.{minor - 1}.{rng.randint(0, 6)}"
    day = dt.date(2025, rng.randint(1, 11), rng.randint(1, 27))
    dep_h, dep_m = rng.randint(12, 14), rng.randint(10, 45)
    err_pct = round(rng.uniform(10.5, 17.9), 1)
    p99 = rng.randint(2300, 3400)
    mem = round(rng.uniform(95.0, 99.2), 1)
    pid = rng.randint(20000, 64000)
    job = f"JOB-{digits(rng, 6)}"
    win_old, win_new = "22:00 UTC", rng.choice(["23:30 UTC", "23:00 UTC", "00:30 UTC"])
    alert_ids = [f"AL-{digits(rng, 4)}" for _ in range(2)]

    s.system(
        "You are the on-call operations agent. Runbook rules:\n"
        "1. Never restart or fail over a database primary without written approval from the on-call DBA.\n"
        "2. Every change must reference an incident ID and be recorded in the incident notes.\n"
        "3. Prefer the least disruptive fix; rollbacks of production services need the incident commander's go.\n"
        "4. Do not delete logs younger than 7 days.",
        3, ["Never restart or fail over a database primary", "must reference an incident ID",
            "Prefer the least disruptive fix", "Do not delete logs younger than 7 days"])
    s.user(f"We're getting paged for {svc} on {host}: p99 latency above 2 s and lots of 5xx. Incident is {inc}. "
           f"Please find out what's wrong and fix it, but do not touch {db}, it's the database primary.",
           I, 3, [svc, host, inc, f"do not touch {db}"])
    s.fact("incident", inc, "id", "What is the incident ID?")
    s.fact("host", host, "id", "Which host is affected?")
    s.call("get_alerts", {"service": svc}, R, 0, text="Looking at the active alerts first.")
    s.tool([{"alert_id": alert_ids[0], "name": "HighLatencyP99", "host": host, "since": f"{dep_h}:{dep_m + 4:02d} UTC",
             "value_ms": p99},
            {"alert_id": alert_ids[1], "name": "Http5xxRate", "host": host, "since": f"{dep_h}:{dep_m + 6:02d} UTC",
             "value_pct": round(err_pct - 1.3, 1)}], K, 2, alert_ids + [f'"value_ms": {p99}'])
    s.call("get_host_metrics", {"host": host}, R, 1, [host])
    s.tool({"host": host, "cpu_pct": rng.randint(30, 45), "mem_pct": mem, "disk_pct": {"/": 62, "/var/log": 91},
            "load1": 3.2, "uptime_days": rng.randint(20, 90)}, K, 2, [f'"mem_pct": {mem}', '"/var/log": 91'])
    s.call("tail_logs", {"host": host, "service": svc, "lines": 50}, R, 1)
    s.tool(f"{day.isoformat()}T{dep_h}:{dep_m + 3:02d}:51Z WARN  [gc] GC overhead limit approaching (98% time in GC)\n"
           f"{day.isoformat()}T{dep_h}:{dep_m + 4:02d}:07Z ERROR [http-nio-8080-exec-41] java.lang.OutOfMemoryError: Java heap space\n"
           f"{day.isoformat()}T{dep_h}:{dep_m + 4:02d}:07Z ERROR [http-nio-8080-exec-12] request failed status=503 path=/v1/{svc.split('-')[0]}\n"
           f"{day.isoformat()}T{dep_h}:{dep_m + 4:02d}:09Z ERROR [cache-loader] PriceCache.refresh: java.lang.OutOfMemoryError: Java heap space\n"
           f"... 46 similar lines ...", K, 2, ["java.lang.OutOfMemoryError: Java heap space", "PriceCache.refresh"])
    s.say(f"Memory is at {mem}% and the JVM is throwing OutOfMemoryError, mostly from PriceCache.refresh. CPU is "
          "fine, so this looks like a leak rather than load. Let me check whether something was deployed recently.",
          R, 1, ["PriceCache.refresh"])
    s.call("get_deploys", {"service": svc, "limit": 3}, R, 1)
    s.tool([{"version": new, "deployed_at": f"{day.isoformat()}T{dep_h}:{dep_m:02d}:00Z", "by": "ci-pipeline"},
            {"version": prev, "deployed_at": f"{(day - dt.timedelta(days=6)).isoformat()}T09:15:00Z", "by": "ci-pipeline"}],
           K, 2, [new, prev, f"{dep_h}:{dep_m:02d}"])
    s.say(f"Root cause: the heap errors started a few minutes after {new} was deployed at {dep_h}:{dep_m:02d} UTC, "
          f"and the new PriceCache refresh keeps growing the heap. Options: (a) restart {svc} for quick relief "
          f"(the heap will fill up again in a few hours), (b) roll back to {prev}, the last good version.",
          K, 2, [f"after {new} was deployed", prev])
    s.fact("bad_version", new, "id", "Which deployed version caused the memory leak?")
    s.user(f"Roll back to {prev}, but only after {win_old} when traffic drops. Restart now only if the 5xx rate "
           "is above 10%.", I, 3, [f"Roll back to {prev}", f"only after {win_old}", "5xx rate is above 10%"])
    s.fact("rollback_version", prev, "id", "To which version will the service be rolled back?")
    s.fact("restart_threshold", "5xx rate is above 10%", "constraint", "When may the agent restart right away?")
    if v % 2 == 0:
        s.user("Third page this week, by the way. Coffee is my only friend.", F, 0)
        s.say("Sorry about the pager load, that sounds rough!", F, 0)
    s.call("get_service_metrics", {"service": svc, "host": host, "window_min": 5}, R, 1)
    s.tool({"http_5xx_pct": err_pct, "p99_ms": p99, "rps": rng.randint(400, 1200)}, K, 2, [f'"http_5xx_pct": {err_pct}'])
    restart = {"host": host, "service": svc, "incident": inc}
    s.call("restart_service", restart, F, 0, text=f"{err_pct}% is above your 10% threshold, so I'll restart now.")
    s.tool("Error: permission denied: restart_service requires role ops-oncall (token has ops-readonly)", F, 1,
           ["permission denied", "requires role ops-oncall"])
    s.say("Sorry, the restart was refused: my token only has the ops-readonly role. Can you grant ops-oncall, or run "
          "the restart yourself?", F, 1, ["ops-oncall"])
    s.user(f"Granted ops-oncall to your token for 2 hours under {inc}. Go ahead.", I, 3, ["Go ahead"])
    s.call("restart_service", restart, K, 2, [host, svc, inc])
    s.tool({"host": host, "service": svc, "status": "active", "pid": pid,
            "restarted_at": f"{day.isoformat()}T{dep_h + 1}:{rng.randint(10, 50)}:12Z"}, K, 3, ['"status": "active"', str(pid)])
    s.call("get_service_metrics", {"service": svc, "host": host, "window_min": 5}, R, 1)
    s.tool({"http_5xx_pct": 0.3, "p99_ms": 420, "rps": rng.randint(400, 1200)}, K, 2, ['"http_5xx_pct": 0.3', '"p99_ms": 420'])
    s.say(f"Restart done (pid {pid}). The 5xx rate is down to 0.3% and p99 to 420 ms. The leak is still in {new}, "
          f"so I expect the heap to fill again within a few hours; the rollback to {prev} is still needed.",
          K, 3, ["0.3%", "420 ms", f"rollback to {prev} is still needed"])
    s.user(f"Change of plan: the rollback window moves to {win_new}, the release manager wants to watch it.",
           I, 3, [f"rollback window moves to {win_new}"])
    s.fact("rollback_window", win_new, "time", "When will the rollback happen?", superseded=win_old)
    hh, mm = win_new[:5].split(":")
    when_day = day + dt.timedelta(days=1) if hh == "00" else day
    s.call("schedule_job", {"action": "rollback", "service": svc, "to_version": prev,
                            "at": f"{when_day.isoformat()}T{hh}:{mm}:00Z", "incident": inc},
           K, 2, [prev, f"{hh}:{mm}:00Z", inc])
    s.tool({"job_id": job, "status": "scheduled", "at": f"{when_day.isoformat()}T{hh}:{mm}:00Z"}, K, 3, [job, '"status": "scheduled"'])
    s.fact("job_id", job, "id", "What is the ID of the scheduled rollback job?")
    s.call("add_incident_note", {"incident": inc, "note": f"Root cause: heap leak in PriceCache.refresh since {new}. "
                                 f"Restarted {svc} on {host} (pid {pid}). Rollback to {prev} scheduled as {job} "
                                 f"at {win_new}."}, K, 1, [inc, job])
    s.tool({"incident": inc, "notes": 4, "status": "ok"}, K, 1, [inc])
    if v % 2 == 1:
        s.user("While you're there, /var/log at 91% worries me. Clean it up, but keep the last 7 days of logs.",
               I, 3, ["/var/log at 91%", "keep the last 7 days of logs"])
        s.call("run_command", {"host": host, "command": f"rm -rf /var/log/{svc}/*.gz", "incident": inc}, F, 0)
        s.tool("Error: command not allowed by policy: 'rm -rf' is blocked on production hosts", F, 1,
               ["command not allowed by policy"])
        s.say("That was the wrong tool for it anyway: the blanket delete is blocked, and it would have removed recent "
              "logs too. I'll delete only compressed logs older than 7 days.", F, 0)
        s.call("run_command", {"host": host, "command": f"find /var/log/{svc} -name '*.gz' -mtime +7 -delete",
                               "incident": inc}, K, 2, ["-mtime +7"])
        s.tool({"exit_code": 0, "stdout": "", "stderr": ""}, R, 0)
        s.call("get_host_metrics", {"host": host}, R, 1, [host])
        s.tool({"host": host, "cpu_pct": 21, "mem_pct": 41.5, "disk_pct": {"/": 62, "/var/log": 54}}, K, 2, ['"/var/log": 54'])
        s.say("Cleaned up: compressed logs older than 7 days are gone and /var/log is at 54% now.", K, 2, ["54%"])
    s.say(f"Summary for {inc}: {svc} on {host} restarted and healthy (5xx 0.3%); root cause is the heap leak in {new}; "
          f"rollback to {prev} scheduled at {win_new} as {job}; everything is in the incident notes. {db} was not "
          "touched.", K, 3, [inc, new, prev, win_new, job])
    s.user("Great work, thanks.", F, 0)
    s.say("Anytime. I'll keep an eye on the heap until the rollback.", F, 0)


# ------------------------------------------------------------------------------------------------
# restaurant + scheduling: dietary constraints, no availability, party-size change, calendar errors
# ------------------------------------------------------------------------------------------------
RESTAURANTS = ["Saffron Table", "Olive & Ash", "The Green Fork", "Casa Verde", "Lotus Garden", "Harvest Kitchen",
               "Juniper Hall", "Marigold Bistro"]
OFFICES = [("200 Market Street", "Pacific Time"), ("55 Water Street", "Eastern Time"),
           ("1 Riverside Plaza", "Central Time"), ("800 Congress Avenue", "Central Time")]
ROOMS = ["Aspen", "Birch", "Cedar", "Maple", "Willow"]


def restaurant(s: Session, rng: random.Random, v: int) -> None:
    bf, bl = en_name(rng)
    boss = f"{bf} {bl}"
    addr, tz = rng.choice(OFFICES)
    fri = dt.date(2025, rng.randint(2, 11), 1)
    fri += dt.timedelta(days=(4 - fri.weekday()) % 7 + 7 * rng.randint(0, 2))
    n_old = rng.choice([5, 6])
    n_new = n_old + 2
    pp = rng.choice([50, 60, 70, 80])
    colleagues = []
    while len(colleagues) < 3:
        f, _ = en_name(rng)
        if f != bf and f not in colleagues:
            colleagues.append(f)
    a, b, c = colleagues
    allergic = c
    r1, r2, r3 = rng.sample(RESTAURANTS, 3)
    phone = f"+1 {rng.randint(201, 989)} 555 {digits(rng, 4)}"
    conf = f"CNF-{code(rng, 6)}"
    ev1, ev2 = f"evt_{code(rng, 10, 'abcdefghijklmnopqrstuvwxyz0123456789')}", f"evt_{code(rng, 10, 'abcdefghijklmnopqrstuvwxyz0123456789')}"
    room = rng.choice(ROOMS)
    mon = fri + dt.timedelta(days=3)
    tue, wed, thu = (mon + dt.timedelta(days=k) for k in (1, 2, 3))
    domain = "acme.io"

    s.system(
        f"You are {boss}'s personal assistant. You can search restaurants, check availability, book tables and manage "
        f"{bf}'s calendar. Confirm date, time, party size and the name on the booking before you book. Never share "
        f"calendar details with anyone outside the company. All times are {tz}.",
        3, ["Confirm date, time, party size and the name on the booking", "Never share calendar details", f"All times are {tz}"])
    s.user(f"Can you book a team dinner for {en_day(fri)}? We're {n_old} people, around 7pm, within walking distance "
           f"of the office at {addr}. Max ${pp} per person, and it must have proper vegetarian options. Also {allergic} "
           "has a severe peanut allergy, so no places that cook with peanuts.",
           I, 3, [en_day(fri), f"{n_old} people", "around 7pm", f"walking distance of the office at {addr}",
                  f"Max ${pp} per person", "proper vegetarian options", "severe peanut allergy"])
    s.fact("dinner_date", en_day(fri), "date", "On which date is the team dinner?")
    s.fact("allergy", "severe peanut allergy", "constraint", f"Which dietary restriction does {allergic} have?")
    s.say(f"Sure! Should the booking be under your name, {bf}?", R, 0)
    s.user(f"Yes, under my name. My number is {phone} if they need one.", K, 2, [phone])
    s.fact("phone", phone, "phone", "Which phone number goes on the booking?")
    s.call("search_restaurants", {"near": addr, "max_walk_min": 15, "party_size": n_old,
                                  "dietary": ["vegetarian", "peanut-free"], "max_price_pp": pp}, R, 1, [addr])
    s.tool([{"name": r1, "walk_min": 6, "price_pp": pp - 12, "vegetarian": "dedicated menu", "peanut_free_kitchen": True,
             "rating": 4.6},
            {"name": r2, "walk_min": 11, "price_pp": pp - 6, "vegetarian": "several dishes", "peanut_free_kitchen": True,
             "rating": 4.4},
            {"name": r3, "walk_min": 4, "price_pp": pp - 20, "vegetarian": "several dishes", "peanut_free_kitchen": False,
             "rating": 4.7}], K, 2, [r1, r2, '"peanut_free_kitchen": false'])
    s.say(f"Two places fit: {r1} (6 min walk, about ${pp - 12} per person, dedicated vegetarian menu, peanut-free "
          f"kitchen) and {r2} (11 min, about ${pp - 6}). {r3} is closer and cheaper, but it cooks with peanut oil, so "
          "I left it out.", R, 1, [r1, r2])
    s.user(f"{r1} sounds great, 7pm please.", I, 3, [r1, "7pm"])
    s.call("check_availability", {"restaurant": r1, "date": fri.isoformat(), "time": "19:00", "party_size": n_old}, R, 1,
           [r1, fri.isoformat()])
    s.tool({"restaurant": r1, "available": False, "alternatives": ["18:15", "20:45"]}, F, 1, ['"available": false'])
    s.say(f"Sorry, {r1} is fully booked at 7pm that day. They could do 6:15pm or 8:45pm.", F, 1, ["6:15pm", "8:45pm"])
    s.user(f"8:45 is too late on a work night and 6:15 too early. Try {r2} at 7 instead.", I, 3, [f"Try {r2} at 7"])
    s.call("check_availability", {"restaurant": r2, "date": fri.isoformat(), "time": "19:00", "party_size": n_old}, R, 1,
           [r2])
    s.tool({"restaurant": r2, "available": True, "table": "T12", "max_party": n_old}, K, 1, ['"available": true'])
    if v % 2 == 0:
        s.user(f"Random question: what's a good farewell gift for a colleague who loves hiking? {a} is leaving next month.", F, 0)
        s.say("A good pair of merino hiking socks or a national park pass are both popular choices. Back to dinner!", F, 0)
    s.user(f"Oh, and two more people just confirmed, so we're {n_new} people now, not {n_old}.", I, 3,
           [f"we're {n_new} people now"])
    s.fact("party_size", f"{n_new} people", "count", "How many people is the dinner booked for?", superseded=f"{n_old} people")
    s.call("check_availability", {"restaurant": r2, "date": fri.isoformat(), "time": "19:00", "party_size": n_new}, R, 1,
           [f'"party_size": {n_new}'])
    s.tool({"restaurant": r2, "available": True, "table": "T3 (long table)", "max_party": 10}, K, 2, ["T3 (long table)"])
    s.say(f"Good news, they can seat {n_new} at a long table. To confirm: {r2}, {en_day(fri)} at 7:00pm, {n_new} people, "
          f"under {boss}, with a note about the peanut allergy. Shall I book it?", R, 1, [r2, f"{n_new} people"])
    s.user("Yes please.", I, 2, ["Yes please"])
    s.call("book_table", {"restaurant": r2, "date": fri.isoformat(), "time": "19:00", "party_size": n_new, "name": boss,
                          "phone": phone, "notes": "severe peanut allergy in the party; several vegetarians"},
           K, 2, [r2, fri.isoformat(), "19:00", boss])
    s.tool({"confirmation": conf, "restaurant": r2, "date": fri.isoformat(), "time": "19:00", "party_size": n_new,
            "cancellation": "free until 24 hours before"}, K, 3, [conf, '"party_size": ' + str(n_new)])
    s.fact("dinner_confirmation", conf, "id", "What is the restaurant confirmation code?")
    s.fact("restaurant", r2, "name", "Which restaurant was booked for the team dinner?")
    s.say(f"Booked! {r2}, {en_day(fri)} at 7:00pm for {n_new}, confirmation {conf}. Free cancellation until 24 hours "
          "before.", K, 3, [r2, conf])
    s.user(f"Put it in my calendar and invite {a}, {b} and {c}.", I, 2, [a, b, c])
    bad = [f"{a.lower()}@{domain}", f"{b.lower()}@acme", f"{c.lower()}@{domain}"]
    s.call("create_event", {"title": "Team dinner", "start": f"{fri.isoformat()}T19:00", "duration_min": 150,
                            "location": r2, "attendees": bad}, F, 0)
    s.tool(f"Error: invalid attendee email '{b.lower()}@acme'", F, 1, [f"invalid attendee email '{b.lower()}@acme'"])
    s.say(f"Sorry, I guessed {b}'s address and got it wrong. Let me look the three of them up properly.", F, 0)
    s.call("lookup_contacts", {"names": [a, b, c]}, R, 1)
    emails = [f"{a.lower()}@{domain}", f"{b.lower()}.{rng.choice(['r', 'k', 'm', 's'])}@{domain}", f"{c.lower()}@{domain}"]
    s.tool([{"name": n, "email": e} for n, e in zip((a, b, c), emails, strict=True)], K, 2, emails)
    s.call("create_event", {"title": "Team dinner", "start": f"{fri.isoformat()}T19:00", "duration_min": 150,
                            "location": r2, "attendees": emails}, K, 2, emails)
    s.tool({"event_id": ev1, "status": "created", "invites_sent": 3}, K, 2, [ev1])
    s.say(f"The dinner is in your calendar and invites went out to {a}, {b} and {c}.", K, 2, [a, b, c])
    s.user(f"Next: find a 45-minute slot next week for a planning meeting with {a} and {b}. Not on Monday, nothing "
           f"before 10am, and book room {room}.", I, 3, ["45-minute slot next week", "Not on Monday",
                                                         "nothing before 10am", f"book room {room}"])
    s.fact("meeting_room", room, "name", "Which room is the planning meeting in?")
    s.call("find_free_slots", {"attendees": [emails[0], emails[1], "me"], "duration_min": 45, "from": tue.isoformat(),
                               "to": (fri + dt.timedelta(days=7)).isoformat(), "earliest": "10:00", "room": room}, R, 1)
    s.tool([{"start": f"{tue.isoformat()}T14:00"}, {"start": f"{wed.isoformat()}T11:00"},
            {"start": f"{thu.isoformat()}T15:30"}], K, 2, [f"{tue.isoformat()}T14:00", f"{wed.isoformat()}T11:00"])
    s.say(f"Everyone and room {room} are free on {en_day(tue)} at 14:00, {en_day(wed)} at 11:00, or {en_day(thu)} at "
          "15:30. Which one do you prefer?", R, 1)
    s.user("Tuesday at 14:00 works.", I, 3, ["Tuesday at 14:00"])
    s.call("create_event", {"title": "Planning", "start": f"{tue.isoformat()}T14:00", "duration_min": 45,
                            "room": room, "attendees": emails[:2]}, K, 2, [f"{tue.isoformat()}T14:00"])
    s.tool({"event_id": ev2, "status": "created", "room": room}, K, 3, [ev2])
    s.say(f"Booked: planning meeting on {en_day(tue)} at 14:00 in {room}, invites sent.", K, 2, [en_day(tue)])
    s.user(f"Hmm, {b} just told me they can't do Tuesday. Move it to Wednesday at 11:00 instead.", I, 3,
           ["Move it to Wednesday at 11:00"])
    s.fact("meeting_time", "Wednesday at 11:00", "time", "When is the planning meeting?", superseded="Tuesday at 14:00")
    s.call("update_event", {"event_id": ev2, "start": f"{wed.isoformat()}T11:00"}, K, 2, [ev2, f"{wed.isoformat()}T11:00"])
    s.tool({"event_id": ev2, "status": "updated", "start": f"{wed.isoformat()}T11:00", "room": room}, K, 3,
           [f"{wed.isoformat()}T11:00"])
    s.say(f"Moved: the planning meeting is now {en_day(wed)} at 11:00 in {room}; {a} and {b} got the update.",
          K, 3, [en_day(wed), "11:00", room])
    s.user("Perfect, thank you!", F, 0)
    s.say(f"My pleasure, {bf}. Enjoy the dinner!", F, 0)
