"""中文场景模板（bundled 数据集）。每个函数填充一个 :class:`Session`。

标注遵循 ../shared/datasets/labels/README.md；指南留有余地之处的约定写在 data/README.md
（"Bundled project-written set" 一节）。
"""

from __future__ import annotations

import datetime as dt
import random

from builder import F, I, K, R, Session
from slots import code, digits, zh_date, zh_day, zh_name

# ------------------------------------------------------------------------------------------------
# 出行预订：高铁 + 酒店，预算和时间约束，改出发日期，乘车人未核验
# ------------------------------------------------------------------------------------------------
ZH_CITIES = [("北京", "北京南站", "天安门"), ("上海", "上海虹桥站", "外滩"), ("杭州", "杭州东站", "西湖"),
             ("南京", "南京南站", "新街口"), ("武汉", "武汉站", "黄鹤楼"), ("长沙", "长沙南站", "五一广场"),
             ("广州", "广州南站", "珠江新城"), ("成都", "成都东站", "春熙路"), ("西安", "西安北站", "钟楼"),
             ("苏州", "苏州站", "观前街"), ("厦门", "厦门北站", "中山路"), ("郑州", "郑州东站", "二七广场")]
ZH_HOTELS = ["云栖里酒店", "青禾精品酒店", "悦榕湾酒店", "枫丹酒店", "听涛阁酒店", "锦绣华庭酒店", "半山雅舍酒店",
             "南湖宾馆", "知行酒店", "栖云居酒店"]
ZH_BUDGET_CHAINS = ["星程快捷酒店", "佳驿快捷酒店", "易居连锁酒店"]


def _id_number(rng: random.Random) -> str:
    """A made-up 18-character ID-card-shaped number (not a valid real one)."""
    return (f"{rng.choice(['110105', '310104', '330106', '420106', '440104', '510107'])}"
            f"{rng.randint(1975, 2002)}{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}{digits(rng, 3)}"
            f"{rng.choice('0123456789X')}")


def travel(s: Session, rng: random.Random, v: int) -> None:
    name = zh_name(rng)
    p2 = zh_name(rng, (name,))
    member = f"HY{digits(rng, 8)}"
    (o_city, o_st, _), (d_city, d_st, landmark) = rng.sample(ZH_CITIES, 2)
    d_old = dt.date(2025, rng.choice([3, 4, 5, 9, 10, 11]), rng.randint(3, 22))
    d_new = d_old + dt.timedelta(days=rng.choice([1, 2]))
    h = rng.choice([8, 9, 10])
    cap = rng.choice([450, 500, 550, 600, 650])
    nums = rng.sample(range(101, 999), 4)
    g_early, g_ok1, g_ok2, g_ok3 = (f"G{n}" for n in nums)
    t_early = f"0{h - 2}:{rng.choice(['05', '18', '32'])}"
    t_ok1, t_ok2 = f"{h:02d}:{rng.choice(['12', '26', '40'])}", f"{h + 2:02d}:{rng.choice(['05', '33', '48'])}"
    dur_h = rng.randint(3, 5)
    a_ok1 = f"{h + dur_h:02d}:{rng.choice(['07', '29', '51'])}"
    price = cap - rng.choice([38, 55, 71])
    total = price * 2
    order = f"E{digits(rng, 9)}"
    car = rng.randint(2, 8)
    row = rng.randint(3, 17)
    seats = [f"{car:02d}车{row}A", f"{car:02d}车{row}B"]
    idn = _id_number(rng)
    nights = rng.choice([2, 3])
    hmax = rng.choice([400, 450, 500, 600])
    chain = rng.choice(ZH_BUDGET_CHAINS)
    h_over, h_ok, h_nob = rng.sample(ZH_HOTELS, 3)
    hp = hmax - rng.choice([32, 50, 68])
    h_total = hp * nights
    h_id = f"H{digits(rng, 10)}"

    s.system(
        "你是「行旅通」的出行预订助手。必须遵守以下规则：\n"
        "1. 查询用户个人信息或下单之前，先核实用户的会员号；\n"
        "2. 提交订单前，向用户复述车次、乘车人、座位和总价，得到明确同意后才能下单；\n"
        "3. 不得超出用户给出的预算；\n"
        "4. 乘车人必须已完成实名核验才能购票；\n"
        "5. 退改签按铁路规定收取手续费，要提前告知用户。",
        3, ["先核实用户的会员号", "得到明确同意后才能下单", "不得超出用户给出的预算", "乘车人必须已完成实名核验"])
    if v % 2 == 0:
        s.user("你好呀", F, 0)
        s.say("您好！我是行旅通助手，请问有什么可以帮您？", F, 0)
    s.user(f"帮我订{zh_date(d_old)}从{o_city}到{d_city}的高铁票，两个人，二等座。要求上午{h}点以后出发，每张票不超过"
           f"{cap}元，最好下午能到。",
           I, 3, [f"{zh_date(d_old)}从{o_city}到{d_city}", "两个人", "二等座", f"上午{h}点以后出发",
                  f"每张票不超过{cap}元"])
    s.fact("budget", f"每张票不超过{cap}元", "constraint", "每张车票的预算上限是多少？")
    s.fact("earliest", f"上午{h}点以后出发", "constraint", "对出发时间有什么要求？")
    s.say("好的，麻烦提供一下您的会员号，我先核实一下身份。", R, 0)
    s.user(f"会员号{member}。", K, 3, [member])
    s.fact("member_id", member, "id", "用户的会员号是多少？")
    s.call("get_member", {"member_id": member}, R, 1, [member])
    s.tool({"member_id": member, "name": name, "level": "金卡会员",
            "passengers": [{"name": name, "verified": True}, {"name": p2, "verified": False}],
            "payment": ["支付宝", "银行卡尾号" + digits(rng, 4)]},
           K, 2, [name, f'"name": "{p2}", "verified": false'])
    s.call("search_trains", {"from": o_st, "to": d_st, "date": d_old.isoformat(), "seat": "二等座"}, R, 1,
           [o_st, d_st, d_old.isoformat()], text="核实完成。我先查一下当天的车次。")
    s.tool([{"train": g_early, "depart": t_early, "arrive": f"{h + dur_h - 2:02d}:10", "price": price - 40, "left": 21},
            {"train": g_ok1, "depart": t_ok1, "arrive": a_ok1, "price": price, "left": 3},
            {"train": g_ok2, "depart": t_ok2, "arrive": f"{h + dur_h + 2:02d}:20", "price": price + 12, "left": 56}],
           R, 1, [g_early, g_ok1, g_ok2])
    s.say(f"{zh_date(d_old)}符合要求的有两趟：{g_ok1}，{t_ok1}出发，二等座{price}元；{g_ok2}，{t_ok2}出发，{price + 12}元。"
          f"{g_early}虽然便宜一些，但{t_early}就发车了，不符合您{h}点以后出发的要求。", R, 1, [g_ok1, g_ok2])
    s.user(f"对了，{d_city}这个季节有什么好吃的推荐吗？", F, 0)
    s.say(f"{d_city}的老字号小吃都挺有名的，不过我这边没有实时的美食信息，您到了可以问问酒店前台，一般推荐得都很地道。", F, 0)
    s.user(f"刚跟同事确认了，出发日期改成{zh_date(d_new)}，人数不变，其他要求也不变。",
           I, 3, [f"出发日期改成{zh_date(d_new)}", "其他要求也不变"])
    s.fact("date", zh_date(d_new), "date", "出发日期是哪天？", superseded=zh_date(d_old))
    s.call("search_trains", {"from": o_st, "to": d_st, "date": d_new.isoformat(), "seat": "二等座"}, R, 1,
           [d_new.isoformat()])
    s.tool([{"train": g_early, "depart": t_early, "price": price - 40, "left": 9},
            {"train": g_ok3, "depart": t_ok1, "arrive": a_ok1, "price": price, "left": 14},
            {"train": g_ok2, "depart": t_ok2, "price": price + 12, "left": 0}],
           K, 2, [g_ok3, t_ok1, f'"price": {price}', f'"price": {price + 12}, "left": 0'])
    s.say(f"{zh_date(d_new)}的{g_ok2}二等座已经售完了。符合要求的是{g_ok3}：{t_ok1}从{o_st}出发，{a_ok1}到{d_st}，"
          f"二等座{price}元一张，两张共{total}元，在预算内。要订这趟吗？", R, 1, [g_ok3, f"两张共{total}元"])
    s.user(f"就订{g_ok3}吧，乘车人是我和{p2}。", I, 3, [f"就订{g_ok3}", p2])
    s.fact("train", g_ok3, "id", "订的是哪一趟车？")
    book = {"member_id": member, "train": g_ok3, "date": d_new.isoformat(), "seat": "二等座", "passengers": [name, p2]}
    s.call("book_train", book, F, 0)
    s.tool(f"Error: 乘车人「{p2}」未完成实名核验，无法购票", F, 1, ["未完成实名核验"])
    s.say(f"抱歉，出票失败了：乘车人{p2}还没有完成实名核验。麻烦提供一下{p2}的身份证号码，我帮您提交核验。",
          F, 1, ["还没有完成实名核验"])
    s.user(f"身份证号是{idn}。", K, 2, [idn])
    s.call("verify_passenger", {"member_id": member, "name": p2, "id_number": idn}, R, 1, [p2])
    s.tool({"name": p2, "verified": True}, K, 2, ['"verified": true'])
    s.call("book_train", book, K, 2, [g_ok3, d_new.isoformat(), name, p2], text="核验通过了，我重新提交订单。")
    s.tool({"order_id": order, "train": g_ok3, "date": d_new.isoformat(), "seats": seats, "total": total,
            "status": "已出票"}, K, 3, [order, *seats, f'"total": {total}', "已出票"])
    s.fact("order_id", order, "id", "高铁票的订单号是多少？")
    s.fact("seats", seats[0], "id", f"{name}的座位号是多少？")
    s.say(f"已经出票：{zh_date(d_new)} {g_ok3}次，{t_ok1}从{o_st}开，{a_ok1}到{d_st}，二等座{seats[0]}、{seats[1]}，"
          f"两张共{total}元，订单号{order}。", K, 3, [g_ok3, seats[0], seats[1], f"共{total}元", order])
    if v in (1, 2):
        s.user("能不能给我们换成靠窗的连座？", I, 1, ["靠窗的连座"])
        s.say(f"{seats[0]}就是靠窗的位置，{seats[1]}紧挨着，两位已经是连座了，不用换。", K, 1, [seats[0]])
    s.user(f"再帮我在{d_city}订一间酒店，{zh_date(d_new)}入住，住{nights}晚，离{landmark}近一点。每晚不超过{hmax}元，"
           "必须含早餐，不要连锁快捷酒店。",
           I, 3, [f"{zh_date(d_new)}入住", f"住{nights}晚", f"离{landmark}近一点", f"每晚不超过{hmax}元",
                  "必须含早餐", "不要连锁快捷酒店"])
    s.fact("hotel_budget", f"每晚不超过{hmax}元", "constraint", "酒店每晚的预算是多少？")
    s.fact("breakfast", "必须含早餐", "constraint", "酒店对早餐有什么要求？")
    s.call("search_hotels", {"city": d_city, "near": landmark, "check_in": d_new.isoformat(), "nights": nights}, R, 1,
           [landmark])
    s.tool([{"hotel": chain, "type": "连锁快捷", "price": hmax - 180, "breakfast": True, "distance_km": 0.4},
            {"hotel": h_over, "type": "高档型", "price": hmax + 120, "breakfast": True, "distance_km": 0.8},
            {"hotel": h_ok, "type": "精品酒店", "price": hp, "breakfast": True, "distance_km": 1.1},
            {"hotel": h_nob, "type": "舒适型", "price": hp - 60, "breakfast": False, "distance_km": 0.6}],
           K, 2, [h_ok, f'"price": {hp}'])
    s.say(f"帮您筛了一下：{chain}是连锁快捷，{h_over}每晚{hmax + 120}元超预算，{h_nob}不含早餐，都排除了。"
          f"{h_ok}是精品酒店，含早，每晚{hp}元，离{landmark}约1.1公里，比较合适。", R, 1, [h_ok, f"每晚{hp}元"])
    s.user(f"就{h_ok}吧，要双床房。", I, 3, [h_ok, "双床房"])
    s.call("book_hotel", {"member_id": member, "hotel": h_ok, "room": "双床房", "check_in": d_new.isoformat(),
                          "nights": nights, "breakfast": True}, K, 2, [h_ok, "双床房"])
    s.tool({"booking_id": h_id, "hotel": h_ok, "room": "双床房（含双早）", "nights": nights, "total": h_total,
            "cancel": "入住前一天18:00前免费取消"}, K, 3, [h_id, f'"total": {h_total}', "入住前一天18:00前免费取消"])
    s.fact("hotel_booking", h_id, "id", "酒店的预订号是多少？")
    s.say(f"酒店订好了：{h_ok}双床房含双早，{zh_day(d_new)}入住，共{nights}晚，总价{h_total}元，预订号{h_id}。"
          "入住前一天18:00前可以免费取消。", K, 3, [h_ok, f"总价{h_total}元", h_id])
    if v in (0, 3):
        s.user("另外返程的票也先帮我看看？", F, 0)
        s.say("好的，请问返程大概是哪天、几点以后出发？", R, 0)
        s.user("算了，返程时间还没定，先不订了。", I, 2, ["返程时间还没定，先不订了"])
        s.fact("no_return", "先不订了", "decision", "返程票订了吗？")
        s.say("好的，等您定了返程时间再找我。", F, 0)
    else:
        s.user("酒店几点可以入住？", I, 1, ["几点可以入住"])
        s.call("get_hotel_info", {"booking_id": h_id}, R, 1, [h_id])
        s.tool({"check_in_from": "14:00", "check_out_before": "12:00", "parking": "免费"}, K, 1, ['"check_in_from": "14:00"'])
        s.say("下午2点以后可以入住，中午12点前退房，酒店停车免费。", K, 1, ["下午2点以后"])
    s.user("好的，谢谢啦！", F, 0)
    s.say("不客气，祝您旅途顺利！", F, 0)


# ------------------------------------------------------------------------------------------------
# 电商售后：身份核验失败、退货理由选错重试、按实付退款、改地址（电话更正）
# ------------------------------------------------------------------------------------------------
ZH_ITEMS = [("电饭煲", "内胆涂层起皮"), ("空气炸锅", "加热到一半就自动断电"), ("蓝牙耳机", "左耳没有声音"),
            ("扫地机器人", "充电座充不进电"), ("电动牙刷", "充满电只能用一天"), ("台灯", "开关接触不良，一直闪")]
ZH_ADDR = ["浙江省杭州市西湖区文三路259号昌地火炬大厦3号楼", "上海市浦东新区张江路88号2幢1203室",
           "江苏省南京市鼓楼区中山北路30号城市名人酒店公寓A座", "广东省广州市天河区体育西路191号中石化大厦B塔",
           "四川省成都市高新区天府大道中段666号希望大厦", "湖北省武汉市洪山区珞喻路1037号"]


def _phone(rng: random.Random) -> str:
    return rng.choice(["138", "139", "150", "186", "177", "135"]) + digits(rng, 8)


def ecommerce(s: Session, rng: random.Random, v: int) -> None:
    item, problem = rng.choice(ZH_ITEMS)
    phone = _phone(rng)
    phone_typo = phone[:5] + str((int(phone[5]) + 3) % 10) + phone[6:]
    order_a = f"2025{digits(rng, 12)}"
    order_b = f"2025{digits(rng, 12)}"
    uid = f"U{digits(rng, 9)}"
    p1 = rng.choice([329, 399, 459, 529, 599])
    coupon = 30
    paid = p1 - coupon
    signed = dt.date(2025, rng.randint(3, 10), rng.randint(1, 18))
    today = signed + dt.timedelta(days=rng.randint(9, 13))
    rid = f"TH{digits(rng, 10)}"
    addr = rng.choice(ZH_ADDR)
    rname = zh_name(rng)
    r_old = _phone(rng)
    r_new = r_old[:-4] + digits(rng, 4)
    ticket = f"GP{digits(rng, 8)}"

    s.system(
        "你是「优选商城」的售后客服助手。规则：\n"
        "1. 查询或修改订单前，先用手机号和订单号核实用户身份；\n"
        "2. 签收后7天内支持无理由退货，质量问题15天内可以退换；\n"
        "3. 退款默认原路退回，只有用户明确要求时才可以退到商城余额；\n"
        "4. 只有未出库的订单才能修改收货地址；\n"
        "5. 执行退货、退款、改地址之前，必须先跟用户确认。",
        3, ["先用手机号和订单号核实用户身份", "签收后7天内支持无理由退货", "质量问题15天内可以退换", "退款默认原路退回",
            "只有未出库的订单才能修改收货地址"])
    if v % 2 == 0:
        s.user("在吗？", F, 0)
        s.say("在的，您好！请问有什么可以帮您？", F, 0)
    s.user(f"我前几天买的{item}，才用了两次就{problem}，我要退货退款。钱原路退回，不要给我退成优惠券或者余额。",
           I, 3, [item, problem, "退货退款", "原路退回", "不要给我退成优惠券或者余额"])
    s.fact("refund_method", "原路退回", "constraint", "退款要退到哪里？")
    s.say("非常抱歉给您带来不便。麻烦提供一下下单的手机号和订单号，我先核实一下。", R, 0)
    s.user(f"手机号{phone_typo}，订单号{order_a}。", K, 1, [order_a])
    s.fact("order_id", order_a, "id", f"要退货的{item}订单号是多少？")
    s.call("verify_user", {"phone": phone_typo, "order_id": order_a}, F, 0)
    s.tool("Error: 手机号与订单不匹配", F, 1, ["手机号与订单不匹配"])
    s.say("抱歉，系统提示手机号和订单对不上，麻烦再确认一下手机号？", F, 0)
    s.user(f"哦不好意思，手机号是{phone}，刚才打错了一位。", K, 2, [phone])
    s.fact("phone", phone, "phone", "用户下单的手机号是多少？", superseded=phone_typo)
    s.call("verify_user", {"phone": phone, "order_id": order_a}, R, 1, [phone])
    s.tool({"verified": True, "user_id": uid, "nickname": f"{rng.choice(['小', '阿'])}{zh_name(rng)[-1]}"}, K, 2, [uid])
    s.call("get_order", {"order_id": order_a}, R, 1, [order_a])
    s.tool({"order_id": order_a, "status": "已签收", "signed_at": signed.isoformat(),
            "items": [{"sku_id": f"SKU{digits(rng, 8)}", "name": item, "price": p1, "qty": 1}],
            "coupon": f"满300减{coupon}", "paid": paid, "pay_method": "微信支付"},
           K, 3, ['"status": "已签收"', signed.isoformat(), f'"price": {p1}', f"满300减{coupon}", f'"paid": {paid}', "微信支付"])
    s.call("create_return", {"order_id": order_a, "reason": "七天无理由", "refund_to": "原路退回"}, F, 0,
           text="订单已经签收，我这边帮您提交退货申请。")
    s.tool(f"Error: 已超过7天无理由退货期限（签收时间 {signed.isoformat()}）", F, 1, ["已超过7天无理由退货期限"])
    s.say(f"抱歉，刚才按七天无理由提交失败了：您是{zh_date(signed)}签收的，已经超过7天。不过{problem}属于质量问题，"
          "签收15天内都可以退，需要在订单里上传一张故障照片。", F, 1, ["属于质量问题", "签收15天内都可以退"])
    s.user("照片我已经在订单里传好了，你按质量问题重新提交吧。", I, 3, ["按质量问题重新提交"])
    s.call("create_return", {"order_id": order_a, "reason": "质量问题", "refund_to": "原路退回"}, K, 2,
           [order_a, "质量问题", "原路退回"])
    pickup = today + dt.timedelta(days=1)
    s.tool({"return_id": rid, "status": "待取件", "refund_amount": paid, "refund_to": "微信支付（原路退回）",
            "pickup": f"{pickup.isoformat()} 09:00-18:00 上门取件"},
           K, 3, [rid, f'"refund_amount": {paid}', "微信支付（原路退回）", pickup.isoformat()])
    s.fact("return_id", rid, "id", "退货单号是多少？")
    s.say(f"退货申请已经提交，退货单号{rid}。快递员会在{zh_date(pickup)}上门取件，商家收到货后，{paid}元会原路退回您的"
          "微信支付，一般1到3个工作日到账。", K, 3, [rid, zh_date(pickup), f"{paid}元会原路退回"])
    s.fact("refund_amount", f"{paid}元", "amount", "这次退款金额是多少？")
    s.user(f"为什么只退{paid}？我记得价格是{p1}啊。", I, 1, [f"为什么只退{paid}"])
    s.say(f"您下单时用了一张满300减{coupon}的优惠券，实付是{paid}元，所以按实付金额退款。退款完成后，这张优惠券如果还在"
          "有效期内会退回到您的账户。", R, 1, [f"满300减{coupon}", f"实付是{paid}元"])
    s.user("哦原来是这样。你们客服每天要回这么多消息，也挺辛苦的哈", F, 0)
    s.say("谢谢您的理解～能帮到您就好。", F, 0)
    s.user(f"还有一个订单{order_b}还没发货，帮我把收货地址改成{addr}，收件人{rname}，电话{r_old}。",
           I, 3, [order_b, addr, rname, r_old])
    s.fact("new_address", addr, "address", f"订单{order_b}的新收货地址是什么？")
    s.call("get_order", {"order_id": order_b}, R, 1, [order_b], text="好的，我先确认一下这个订单的状态。")
    s.tool({"order_id": order_b, "status": "待发货", "items": [{"name": "收纳箱（3个装）", "qty": 1}]}, K, 2, ['"status": "待发货"'])
    if v % 2 == 0:
        s.user(f"等一下，收件人电话写错了，应该是{r_new}。", I, 3, [r_new])
        s.fact("receiver_phone", r_new, "phone", "新地址的收件人电话是多少？", superseded=r_old)
        s.say(f"好的。跟您确认一下：订单{order_b}改为寄到{addr}，收件人{rname}，电话{r_new}，对吗？", R, 0)
        s.user("对，改吧。", I, 2, ["改吧"])
        s.call("update_address", {"order_id": order_b, "address": addr, "receiver": rname, "phone": r_new}, K, 2,
               [order_b, r_new])
        s.tool({"order_id": order_b, "status": "地址已更新", "address": addr, "receiver": rname, "phone": r_new},
               K, 3, ["地址已更新", r_new])
        s.say(f"改好了，订单{order_b}会寄到{addr}，收件人{rname}，电话{r_new}。", K, 3, [order_b, rname, r_new])
    else:
        s.say(f"订单目前还是待发货。跟您确认一下：订单{order_b}改为寄到{addr}，收件人{rname}，电话{r_old}，对吗？", R, 0)
        s.user("对，改吧。", I, 2, ["改吧"])
        s.call("update_address", {"order_id": order_b, "address": addr, "receiver": rname, "phone": r_old}, F, 0)
        s.tool("Error: 订单已于刚刚出库，无法修改收货地址", F, 1, ["已于刚刚出库，无法修改收货地址"])
        s.say("抱歉，修改失败：订单刚刚已经出库了，系统不允许再改地址。我可以帮您向快递申请改派到新地址，一般当天处理。",
              F, 1, ["申请改派"])
        s.user(f"那帮我申请改派吧。还有电话刚才写错了，应该是{r_new}。", I, 3, ["申请改派", r_new])
        s.fact("receiver_phone", r_new, "phone", "新地址的收件人电话是多少？", superseded=r_old)
        s.call("request_redirect", {"order_id": order_b, "address": addr, "receiver": rname, "phone": r_new}, K, 2,
               [order_b, r_new])
        s.tool({"ticket_id": ticket, "status": "改派申请已受理", "eta": "24小时内"}, K, 3, [ticket, "改派申请已受理"])
        s.fact("redirect_ticket", ticket, "id", "快递改派的工单号是多少？")
        s.say(f"改派申请已经受理，工单号{ticket}，24小时内快递会改送到{addr}，收件人{rname}，电话{r_new}。",
              K, 3, [ticket, rname, r_new])
    s.user("好的，没别的事了，谢谢。", F, 0)
    s.say("不客气，祝您生活愉快！有问题随时找我。", F, 0)


# ------------------------------------------------------------------------------------------------
# 编程智能体：带约束的 bug 修复、复现、第一次修复引入新问题、最终 diff
# ------------------------------------------------------------------------------------------------
def coding(s: Session, rng: random.Random, v: int) -> None:
    from bugs import BUGS, rc

    b = BUGS[[3, 5, 0, 2][v]]
    repo, path, func, tpath, n = b["repo"], b["path"], b["func"], b["test_path"], b["n_tests"]
    test_cmd = f"python -m pytest -q {tpath}"

    def sh(command: str, cat: str, imp: int, spans: list[str] | tuple[str, ...] = (), thought: str = "") -> int:
        return s.call("bash", {"command": command}, cat, imp, spans, text=f"思路：{thought}" if thought else "")

    s.system(
        f"你是一个在 /workspace/{repo} 仓库中工作的软件工程智能体。用 bash 工具执行命令，用 edit_file 工具修改文件"
        "（给出精确的旧字符串和新字符串）。每次回复都以“思路：”开头，说明你的推理。改动要尽量小；除非用户要求，"
        "不要修改 tests/ 下的文件；最后必须展示完整的 diff。",
        3, [f"/workspace/{repo}", "改动要尽量小", "不要修改 tests/ 下的文件", "最后必须展示完整的 diff"])
    s.user(f"请你修复 {repo} 里的这个问题：\n\n<issue>\n{b['title_zh']}\n\n{b['body_zh']}\n</issue>\n\n要求：\n"
           f"- {b['api_zh']}；\n- 不要修改现有的测试；\n- 修复后必须仍然兼容 Python 3.8。\n做完把最终的 diff 给我看。",
           I, 3, [b["title_zh"], b["api_zh"], "不要修改现有的测试", "必须仍然兼容 Python 3.8"])
    s.fact("api_constraint", b["api_zh"], "constraint", f"关于 `{func}` 有什么不能改？")
    s.fact("python_version", "Python 3.8", "constraint", "修复需要兼容哪个 Python 版本？")
    sh("ls -R | head -40", R, 0, thought="先看一下仓库的目录结构。")
    s.tool(rc(0, b["listing"]), R, 0)
    sh(f"grep -rn \"{func}\" --include=*.py . | head -20", R, 0, [func], thought=f"找一下 `{func}` 在哪里定义、在哪里被调用。")
    s.tool(rc(0, b["grep"]), R, 1, [path])
    s.fact("source_path", path, "path", f"`{func}` 定义在哪个文件里？")
    sh(f"cat -n {path}", R, 0, [path], thought=f"`{func}` 在 {path} 里，读一下源码。")
    s.tool(rc(0, b["source"]), R, 1, [b["bug_line"]])
    sh(f"cat > reproduce.py <<'EOF'\n{b['repro']}EOF", R, 0, thought="改代码之前，先写一个最小的复现脚本。")
    s.tool(rc(0, ""), R, 0)
    sh(b.get("repro_cmd", "python reproduce.py"), R, 0, thought="运行复现脚本。")
    if b["repro_rc"]:
        s.tool(rc(b["repro_rc"], b["repro_bug"]), F, 1, [b["repro_bug_span"]])
    else:
        s.tool(rc(0, b["repro_bug"]), K, 2, [b["repro_bug_span"]])
    cause = s.say(f"思路：问题复现了。根因在 {path} 的 `{b['bug_line']}`：{b['cause_zh']}。", K, 2, [path, b["bug_line"]])
    s.fact("root_cause_line", b["bug_line"], "code", "导致 bug 的是哪一行代码？", at=cause)
    if v % 2 == 1:
        s.user("大概要多久？我二十分钟后要开会。", F, 0)
        s.say("思路：应该很快，改动只涉及一个函数，我继续。", F, 0)
    s.user(f"补充一个维护者的要求：{b['late_zh']}，因为{b['late_why_zh']}。", I, 3, [b["late_zh"]])
    s.fact("late_constraint", b["late_zh"], "constraint", "维护者后来补充了什么要求？")
    if v in (0, 3):
        sh(f"pytest -q {tpath}", F, 0, thought="收到。先跑一遍现有测试作为基线。")
        s.tool(rc(127, "bash: pytest: command not found\n"), F, 0, ["pytest: command not found"])
        sh(test_cmd, R, 0, thought="PATH 里没有 pytest，改用模块方式运行。")
    else:
        sh(test_cmd, R, 0, thought="收到。先跑一遍现有测试作为基线。")
    base = b.get("baseline_fail")
    if base:
        s.tool(rc(1, base["out"]), F, 1, [b["fail_test"], base["counts"]])
        note = f"思路：基线里已经有一个失败的测试 {b['fail_test']}，正好覆盖这个问题，其余都通过。开始修改 `{func}`。"
    else:
        s.tool(rc(0, "." * n + " " * (73 - n) + "[100%]\n" + f"{n} passed in 0.03s\n"), R, 1, [f"{n} passed"])
        note = f"思路：基线全部通过。直接修改 `{func}`。"
    old1, new1 = b["fix1"]
    s.call("edit_file", {"path": path, "old": old1, "new": new1}, F, 0, text=note)
    s.tool(f"Edited {path}: replaced 1 occurrence.", R, 0)
    sh(f"{test_cmd} && python reproduce.py", R, 0, thought="先跑测试，再跑复现脚本。")
    s.tool(rc(1, b["fail_out"]), F, 1, [b["fail_test"], b["fail_counts"]])
    s.say(f"思路：{b['fail_test']} 失败了，原因是{b['why_zh']}。", R, 1, [b["fail_test"]])
    old2, new2 = b["fix2"]
    fix = s.call("edit_file", {"path": path, "old": old2, "new": new2}, K, 2, [path],
                 text=f"思路：修正后的改法是 `{b['fix2_code']}`。")
    s.fact("fix", b["fix2_code"], "code", f"{path} 最终是怎么修的？", at=fix)
    s.tool(f"Edited {path}: replaced 1 occurrence.", K, 1, [path])
    sh(f"{test_cmd} && python reproduce.py", R, 0, thought="再跑一遍。")
    fixed = b["repro_fixed"].strip()
    ok = s.tool(rc(0, "." * n + " " * (73 - n) + "[100%]\n" + f"{n} passed in 0.04s\n" + b["repro_fixed"]),
                K, 2, [f"{n} passed"] + ([fixed] if len(fixed) > 2 else []))
    s.fact("tests_passed", f"{n} passed", "count", "修复后通过了多少个测试？", at=ok)
    if v % 2 == 0:
        sh(f"python3.8 -m pytest -q {tpath}", F, 0, thought="要求兼容 Python 3.8，用 3.8 跑一下。")
        s.tool(rc(127, "bash: python3.8: command not found\n"), F, 0, ["python3.8: command not found"])
        sh("tox -e py38 -q", R, 0, thought="系统里没有 python3.8，仓库有 tox 配置，用 tox 跑。")
    else:
        sh("tox -e py38 -q", R, 0, thought="要求兼容 Python 3.8，仓库的 tox 配置里有 py38 环境。")
    s.tool(rc(0, f"{n} passed in 0.05s\n  py38: OK (3.40=setup[1.88]+cmd[1.52] seconds)\n  congratulations :)\n"),
           K, 2, ["py38: OK"])
    sh("rm reproduce.py && git status --short && git diff", R, 0, thought="都通过了。删掉复现脚本，看一下 diff。")
    s.tool(rc(0, f" M {path}\n{b['diff']}"), K, 3, [f" M {path}", b["fix2_code"]])
    s.say(f"思路：完成。只改了 {path}：{b['cause_zh']}，最终改为 `{b['fix2_code']}`。接口没有变，没有改动任何测试，"
          f"{n} 个测试全部通过，tox py38 也通过；维护者补充的要求（{b['late_zh']}）同样满足。",
          K, 3, [path, b["fix2_code"], f"{n} 个测试全部通过"])
    s.user("不错。顺便在 CHANGELOG.md 的 Unreleased 下面加一条记录。", I, 2, ["CHANGELOG.md 的 Unreleased 下面加一条记录"])
    s.call("edit_file", {"path": "CHANGELOG.md", "old": "## Unreleased\n",
                         "new": f"## Unreleased\n\n- {b['changelog_zh']}\n"}, K, 1, ["CHANGELOG.md"],
           text="思路：在 Unreleased 标题下面加一条。")
    s.tool("Edited CHANGELOG.md: replaced 1 occurrence.", K, 1, ["CHANGELOG.md"])
    s.say(f"思路：已在 CHANGELOG.md 中加上：“{b['changelog_zh']}”", K, 1, ["CHANGELOG.md"])
    s.user("谢谢，我去合并了。", F, 0)
    s.say("思路：没有其他事情了，不客气！", F, 0)


# ------------------------------------------------------------------------------------------------
# 数据分析：全角逗号语法错误、除零错误、区域口径变更、只读权限
# ------------------------------------------------------------------------------------------------
ZH_COMPANIES = [("鲜果到家", "xg_dw"), ("青木家居", "qm_warehouse"), ("云帆文具", "yf_dw"), ("乐活运动", "lh_dw")]
EAST = ["上海", "江苏", "浙江", "安徽", "福建", "江西", "山东"]
SOUTH = ["广东", "广西", "海南"]


def _wan(fen: int) -> str:
    """分 -> 万元, two decimals."""
    return f"{fen / 1_000_000:,.2f}"


def analysis(s: Session, rng: random.Random, v: int) -> None:
    company, db = ZH_COMPANIES[v % len(ZH_COMPANIES)]
    m = rng.randint(3, 10)
    ym = f"2025-{m:02d}"
    start, end = f"2025-{m:02d}-01", f"2025-{m + 1:02d}-01"
    prov = {p: (rng.randint(900_000, 4_800_000) * 100 + rng.randint(0, 99)) for p in EAST}
    prov["江西"] = 0 if v % 2 == 0 else prov["江西"]
    orders = {p: (g // rng.randint(14_000, 21_000) if g else 0) for p, g in prov.items()}
    refund = {p: int(g * rng.uniform(0.02, 0.07)) for p, g in prov.items()}
    gmv, n_ord, ref = sum(prov.values()), sum(orders.values()), sum(refund.values())
    rate = ref / gmv * 100
    south = {p: (rng.randint(1_500_000, 7_000_000) * 100 + rng.randint(0, 99)) for p in SOUTH}
    s_gmv = sum(south.values())
    s_ord = sum(g // rng.randint(14_000, 21_000) for g in south.values())
    s_ref = sum(int(g * rng.uniform(0.02, 0.07)) for g in south.values())
    s_rate = s_ref / s_gmv * 100

    s.system(
        f"你是「{company}」的数据分析助手，可以只读访问 {db} 数据仓库（PostgreSQL）。规则：\n"
        "- 只能执行 SELECT 查询，禁止任何写操作（INSERT、UPDATE、DELETE、建表建视图）；\n"
        "- 所有指标必须排除测试账号（user_id 以 test_ 开头）；\n"
        "- 金额单位和小数位数按用户要求；\n"
        "- 结论里要写明统计口径和时间范围。",
        3, ["只能执行 SELECT 查询", "禁止任何写操作", "必须排除测试账号", "user_id 以 test_ 开头", "写明统计口径和时间范围"])
    if v % 2 == 0:
        s.user("早上好～", F, 0)
        s.say("早上好！今天想看什么数据？", F, 0)
    s.user(f"请你帮我统计一下2025年{m}月华东区的GMV、订单数和退款率。只算已支付的订单，金额用万元，保留两位小数。",
           I, 3, [f"2025年{m}月", "华东区", "GMV、订单数和退款率", "只算已支付的订单", "金额用万元", "保留两位小数"])
    s.fact("period", f"2025年{m}月", "date", "统计的是哪个月的数据？")
    s.fact("unit", "金额用万元", "constraint", "金额用什么单位？")
    s.call("list_tables", {}, R, 0, text="好的，我先看看有哪些表。")
    s.tool(["orders", "order_refunds", "users", "dim_region", "dim_product", "app_events"], R, 0)
    s.call("describe_table", {"table": "orders"}, R, 0, more=[("describe_table", {"table": "dim_region"})])
    s.tool([{"column": "order_id", "type": "bigint"}, {"column": "user_id", "type": "text"},
            {"column": "province", "type": "text"}, {"column": "pay_status", "type": "text"},
            {"column": "paid_at", "type": "timestamp"}, {"column": "pay_amount_fen", "type": "bigint"},
            {"column": "refund_amount_fen", "type": "bigint"}], R, 1, ["province", "pay_amount_fen", "refund_amount_fen"])
    s.tool([{"column": "province", "type": "text"}, {"column": "region", "type": "text"}], R, 1, ["region"])
    s.say("orders 表里只有省份，没有大区字段，需要关联 dim_region 按 region = '华东' 过滤。金额字段单位是分，"
          "最后要除以 1000000 换算成万元。退款率按退款金额除以支付金额计算。", R, 1,
          ["关联 dim_region", "单位是分", "除以 1000000 换算成万元"])
    where = (f"WHERE r.region = '华东' AND o.pay_status = 'PAID' AND o.user_id NOT LIKE 'test\\_%'\n"
             f"  AND o.paid_at >= '{start}' AND o.paid_at < '{end}'")
    bad = ("SELECT sum(o.pay_amount_fen) AS gmv_fen，count(*) AS orders, sum(o.refund_amount_fen) AS refund_fen\n"
           f"FROM orders o JOIN dim_region r ON r.province = o.province\n{where}")
    s.call("run_sql", {"query": bad}, F, 0)
    s.tool('ERROR:  syntax error at or near "，"\nLINE 1: SELECT sum(o.pay_amount_fen) AS gmv_fen，count(*) AS orders, ...',
           F, 1, ['syntax error at or near "，"'])
    good = bad.replace("，", ", ")
    s.call("run_sql", {"query": good}, R, 1, ["r.region = '华东'", "NOT LIKE 'test\\\\_%'"],
           text="抱歉，SQL 里混进了一个全角逗号，改掉重新执行。")
    s.tool([{"gmv_fen": gmv, "orders": n_ord, "refund_fen": ref}], K, 2, [str(gmv), str(n_ord), str(ref)])
    res = s.say(f"2025年{m}月华东区（已支付订单，已排除测试账号，按支付时间 {start} 至 {ym}-{(dt.date(2025, m + 1, 1) - dt.timedelta(days=1)).day} 统计）：\n"
                f"- GMV：{_wan(gmv)} 万元\n- 订单数：{n_ord:,} 单\n- 退款金额：{_wan(ref)} 万元，退款率 {rate:.2f}%",
                K, 3, [f"GMV：{_wan(gmv)} 万元", f"订单数：{n_ord:,} 单", f"退款率 {rate:.2f}%"])
    s.fact("gmv_east", f"{_wan(gmv)} 万元", "amount", "华东区当月的GMV是多少？", at=res)
    s.fact("refund_rate_east", f"{rate:.2f}%", "number", "华东区当月的退款率是多少？", at=res)
    s.user("按省份拆开看看，退款率也分省算。", I, 2, ["按省份拆开", "退款率也分省算"])
    by_prov = ("SELECT r.province, coalesce(sum(o.pay_amount_fen), 0) AS gmv_fen, count(o.order_id) AS orders,\n"
               "       round(100.0 * coalesce(sum(o.refund_amount_fen), 0) / coalesce(sum(o.pay_amount_fen), 0), 2) AS refund_rate\n"
               "FROM dim_region r LEFT JOIN orders o ON o.province = r.province\n"
               f"  AND o.pay_status = 'PAID' AND o.user_id NOT LIKE 'test\\_%' AND o.paid_at >= '{start}' AND o.paid_at < '{end}'\n"
               "WHERE r.region = '华东'\nGROUP BY r.province ORDER BY gmv_fen DESC")
    top = max(prov, key=lambda p: prov[p])
    if v % 2 == 0:
        s.call("run_sql", {"query": by_prov}, F, 0)
        s.tool("ERROR:  division by zero", F, 1, ["division by zero"])
        s.call("run_sql", {"query": by_prov.replace("coalesce(sum(o.pay_amount_fen), 0), 2)", "nullif(sum(o.pay_amount_fen), 0), 2)")},
               R, 1, ["nullif(sum(o.pay_amount_fen), 0)"], text="有省份当月没有订单，分母是 0。用 NULLIF 处理一下。")
    else:
        s.call("run_sql", {"query": by_prov.replace("coalesce(sum(o.pay_amount_fen), 0), 2)", "nullif(sum(o.pay_amount_fen), 0), 2)")},
               R, 1, ["nullif(sum(o.pay_amount_fen), 0)"])
    rows = sorted(EAST, key=lambda p: -prov[p])
    s.tool([{"province": p, "gmv_fen": prov[p], "orders": orders[p],
             "refund_rate": (f"{refund[p] / prov[p] * 100:.2f}" if prov[p] else None)} for p in rows],
           K, 2, [f'"province": "{top}"'])
    lines = "\n".join(f"| {p} | {_wan(prov[p])} | {orders[p]:,} | " + (f"{refund[p] / prov[p] * 100:.2f}%" if prov[p] else "—")
                      + " |" for p in rows)
    note = "江西当月没有已支付订单，退款率记为“—”。" if v % 2 == 0 else ""
    s.say(f"分省结果（单位：万元）：\n\n| 省份 | GMV | 订单数 | 退款率 |\n|---|---|---|---|\n{lines}\n\n{top}贡献最大。{note}",
          K, 2, [f"| {top} | {_wan(prov[top])} |", f"{top}贡献最大"])
    s.user("这个月数据看着还行，这下老板应该不会骂我了哈哈", F, 0)
    s.say("哈哈，祝汇报顺利～", F, 0)
    s.user("等一下，老板说这次要看的是华南区，不是华东区。口径不变，重新算一下总数。", I, 3,
           ["要看的是华南区，不是华东区", "口径不变"])
    s.fact("region", "华南区", "name", "这次要统计的是哪个大区？", superseded="华东区")
    s.call("run_sql", {"query": good.replace("'华东'", "'华南'")}, R, 1, ["r.region = '华南'"])
    s.tool([{"gmv_fen": s_gmv, "orders": s_ord, "refund_fen": s_ref}], K, 2, [str(s_gmv), str(s_ord)])
    res = s.say(f"2025年{m}月华南区（广东、广西、海南；口径同上）：\n- GMV：{_wan(s_gmv)} 万元\n- 订单数：{s_ord:,} 单\n"
                f"- 退款金额：{_wan(s_ref)} 万元，退款率 {s_rate:.2f}%",
                K, 3, [f"GMV：{_wan(s_gmv)} 万元", f"订单数：{s_ord:,} 单", f"退款率 {s_rate:.2f}%"])
    s.fact("gmv_south", f"{_wan(s_gmv)} 万元", "amount", "华南区当月的GMV是多少？", at=res)
    s.fact("orders_south", f"{s_ord:,} 单", "count", "华南区当月有多少订单？", at=res)
    s.user("能不能顺手把测试账号的订单从表里删掉？每次都要排除太麻烦了。", I, 1, ["把测试账号的订单从表里删掉"])
    s.say("这个我做不了：我只有只读权限，规则也禁止任何写操作。建议找数据平台的同事在入仓的 ETL 里过滤掉测试账号，"
          "或者建一张排除测试账号的视图，之后直接查视图就行。", R, 1, ["只有只读权限", "禁止任何写操作"])
    s.user("行吧，我去找他们。谢谢！", F, 0)
    s.say("不客气，有需要随时叫我。", F, 0)


# ------------------------------------------------------------------------------------------------
# 运维：磁盘写满、日志轮转失效、备份盘也满、维护窗口变更
# ------------------------------------------------------------------------------------------------
ZH_SERVICES = ["order-center", "user-profile", "coupon-svc", "pay-notify", "search-api", "im-gateway"]


def itops(s: Session, rng: random.Random, v: int) -> None:
    svc = rng.choice(ZH_SERVICES)
    host = f"app-{rng.choice(['bj', 'sh', 'hz', 'sz'])}-{rng.randint(1, 30):02d}"
    db = f"mysql-master-0{rng.randint(1, 3)}"
    ticket = f"OPS-{digits(rng, 6)}"
    day = dt.date(2025, rng.randint(1, 11), rng.randint(1, 27))
    nxt = day + dt.timedelta(days=1)
    log_g = rng.randint(360, 430)
    gz_g = round(log_g / rng.uniform(8.5, 10.5), 1)
    job = f"JOB-{digits(rng, 6)}"
    chg = f"CHG-{digits(rng, 6)}"
    p99 = rng.randint(1400, 1900)
    to_pct = round(rng.uniform(2.1, 4.8), 1)

    s.system(
        "你是运维值班助手。操作规范：\n"
        "1. 未经DBA书面同意，禁止重启或切换数据库主库；\n"
        "2. 所有变更必须关联工单号，并在工单里记录；\n"
        "3. 删除任何文件之前必须先备份；\n"
        "4. 生产环境的服务重启只能在维护窗口内进行，紧急情况需要值班负责人批准。",
        3, ["禁止重启或切换数据库主库", "所有变更必须关联工单号", "删除任何文件之前必须先备份", "重启只能在维护窗口内进行"])
    s.user(f"线上{svc}接口大量超时，告警显示{host}的磁盘使用率98%。工单号{ticket}。请你排查处理，要求：不要动数据库主库{db}；"
           "清理日志前先备份到 /backup；所有操作都要在工单里留痕。",
           I, 3, [svc, host, ticket, f"不要动数据库主库{db}", "清理日志前先备份到 /backup", "在工单里留痕"])
    s.fact("ticket", ticket, "id", "这次故障的工单号是多少？")
    s.fact("db_constraint", f"不要动数据库主库{db}", "constraint", "哪台机器不能动？")
    s.call("get_host_metrics", {"host": host}, R, 0, text="先看一下这台机器的整体情况。")
    s.tool({"host": host, "cpu_pct": rng.randint(18, 35), "mem_pct": round(rng.uniform(52, 70), 1),
            "disk_pct": {"/": 41, "/data": 98}, "inode_pct": {"/data": 12}}, K, 2, ['"/data": 98'])
    s.call("run_command", {"host": host, "command": "du -sh /data/* | sort -rh | head -5", "ticket": ticket}, R, 1)
    s.tool({"exit_code": 0, "stdout": f"{log_g + 6}G\t/data/logs\n38G\t/data/app\n12G\t/data/tmp\n2.1G\t/data/cache\n"},
           R, 1, [f"{log_g + 6}G"])
    s.call("run_command", {"host": host, "command": f"ls -lh /data/logs/{svc}/ | tail -5", "ticket": ticket}, R, 0)
    s.tool({"exit_code": 0, "stdout": f"-rw-r--r-- 1 app app {log_g}G {day.isoformat()} 10:41 access.log\n"
                                      f"-rw-r--r-- 1 app app 3.2G {day.isoformat()} 10:41 error.log\n"
                                      "-rw-r--r-- 1 app app 1.1G 2025-01-03 00:00 gc.log\n"},
           K, 2, [f"{log_g}G", "access.log"])
    s.say(f"磁盘基本被 /data/logs/{svc}/access.log 占满了，单个文件就有 {log_g}G，按理说日志每天都会轮转，"
          "这么大说明轮转没有生效。看一下 logrotate 的配置。", R, 1, ["access.log", f"{log_g}G"])
    s.call("run_command", {"host": host, "command": f"cat /etc/logrotate.d/{svc}", "ticket": ticket}, R, 0)
    s.tool({"exit_code": 0, "stdout": f"/var/log/{svc}/*.log {{\n    daily\n    rotate 7\n    compress\n    missingok\n}}\n"},
           K, 2, [f"/var/log/{svc}/*.log"])
    s.say(f"根因找到了：logrotate 配置里写的路径是 /var/log/{svc}/*.log，但服务的日志实际写在 /data/logs/{svc}/ 下，"
          f"所以一直没有轮转，access.log 一路涨到 {log_g}G 把盘写满了，写日志阻塞导致接口超时。", K, 2,
          [f"/var/log/{svc}/*.log", f"/data/logs/{svc}/", "一直没有轮转"])
    s.fact("root_cause", f"/var/log/{svc}/*.log", "path", "logrotate 配置里写错的路径是什么？")
    s.user("先把磁盘空间腾出来。只保留最近3天的日志，更早的压缩后备份，再删。", I, 3,
           ["只保留最近3天的日志", "更早的压缩后备份，再删"])
    s.fact("retention", "只保留最近3天的日志", "constraint", "日志要保留多久？")
    s.call("run_command", {"host": host, "command": f"mkdir -p /backup/{svc} && gzip -c /data/logs/{svc}/access.log > "
                           f"/backup/{svc}/access-{day.isoformat()}.log.gz", "ticket": ticket}, F, 0)
    s.tool({"exit_code": 1, "stderr": "gzip: /backup/" + svc + f"/access-{day.isoformat()}.log.gz: No space left on device"},
           F, 1, ["No space left on device"])
    s.say(f"抱歉，备份失败了：/backup 所在的盘也满了。可以改成备份到对象存储 oss://ops-backup/{svc}/ 吗？", F, 1,
          [f"oss://ops-backup/{svc}/"])
    s.user(f"可以，备份到 oss://ops-backup/{svc}/，就用这个路径。", I, 3, [f"oss://ops-backup/{svc}/"])
    s.fact("backup_path", f"oss://ops-backup/{svc}/", "path", "旧日志备份到了哪里？", superseded="/backup")
    s.call("run_command", {"host": host, "command": f"cd /data/logs/{svc} && awk -v d=$(date -d '-3 day' +%F) '$1 < d' "
                           f"access.log | gzip | ossutil cp - oss://ops-backup/{svc}/access-before-3d.log.gz",
                           "ticket": ticket}, K, 2, [f"oss://ops-backup/{svc}/"])
    s.tool({"exit_code": 0, "stdout": f"upload oss://ops-backup/{svc}/access-before-3d.log.gz ({gz_g}G) OK\n"},
           K, 2, [f"access-before-3d.log.gz ({gz_g}G) OK"])
    s.call("run_command", {"host": host, "command": f"cd /data/logs/{svc} && awk -v d=$(date -d '-3 day' +%F) '$1 >= d' "
                           "access.log > access.recent && cat access.recent > access.log && rm access.recent",
                           "ticket": ticket}, K, 2, ["$1 >= d"])
    s.tool({"exit_code": 0, "stdout": "", "stderr": ""}, R, 0)
    s.call("get_host_metrics", {"host": host}, R, 1)
    s.tool({"host": host, "disk_pct": {"/": 41, "/data": 46}}, K, 2, ['"/data": 46'])
    s.say(f"磁盘已经腾出来了：3天前的日志压缩后备份到 oss://ops-backup/{svc}/（{gz_g}G），本地只保留最近3天，"
          "/data 使用率从 98% 降到 46%。", K, 3, [f"oss://ops-backup/{svc}/", "从 98% 降到 46%"])
    if v % 2 == 0:
        s.user("今晚又是通宵的节奏……", F, 0)
        s.say("辛苦了！处理完了早点休息。", F, 0)
    s.user("logrotate 的配置也改一下。改完要重启服务才能生效吗？", I, 2, ["logrotate 的配置也改一下"])
    s.say(f"不需要重启：把路径改成 /data/logs/{svc}/*.log，并加上 copytruncate，轮转时复制后截断原文件，"
          "服务继续写同一个文件句柄就行。", R, 1, ["copytruncate"])
    s.call("run_command", {"host": host, "command": f"sed -i 's#/var/log/{svc}/#/data/logs/{svc}/#; s#compress#compress\\n    "
                           f"copytruncate#' /etc/logrotate.d/{svc}", "ticket": ticket}, K, 2, [f"/data/logs/{svc}/", "copytruncate"])
    s.tool({"exit_code": 0, "stdout": "", "stderr": ""}, K, 1)
    s.call("run_command", {"host": host, "command": f"logrotate -d /etc/logrotate.d/{svc} 2>&1 | head -4", "ticket": ticket},
           R, 0)
    s.tool({"exit_code": 0, "stdout": f"reading config file /etc/logrotate.d/{svc}\nHandling 1 logs\n"
                                      f"rotating pattern: /data/logs/{svc}/*.log  after 1 days (7 rotations)\n"
                                      "copytruncate is set\n"}, K, 2, [f"rotating pattern: /data/logs/{svc}/*.log"])
    s.user("接口超时现在怎么样了？", I, 1, ["接口超时"])
    s.call("get_service_metrics", {"service": svc, "host": host, "window_min": 10}, R, 1)
    s.tool({"p99_ms": p99, "timeout_pct": to_pct, "blocked_threads": rng.randint(40, 90)}, K, 2,
           [f'"timeout_pct": {to_pct}'])
    s.say(f"比之前好多了，但超时率还有 {to_pct}%，p99 {p99} 毫秒，磁盘写满期间积压了一批阻塞线程。建议重启一次 {svc}，"
          "按规范需要放在维护窗口里做。", R, 1, [f"{to_pct}%", f"重启一次 {svc}"])
    s.user(f"那就放到今晚23:00的维护窗口重启，只重启{svc}，数据库别动。", I, 3, ["今晚23:00的维护窗口", f"只重启{svc}"])
    s.user("刚接到通知，今晚的窗口取消了，改到明天早上6:00。", I, 3, ["改到明天早上6:00"])
    s.fact("window", "明天早上6:00", "time", "服务重启安排在什么时候？", superseded="今晚23:00")
    sched = {"action": "restart", "service": svc, "host": host, "at": f"{nxt.isoformat()}T06:00:00+08:00", "ticket": ticket}
    if v % 2 == 1:
        s.call("schedule_job", sched, F, 0)
        s.tool(f"Error: 维护窗口 {nxt.isoformat()} 06:00 未在变更日历中登记", F, 1, ["未在变更日历中登记"])
        s.say("抱歉，排期失败：明早6:00的窗口还没有在变更日历里登记，系统不允许排重启任务。", F, 1, ["变更日历"])
        s.user(f"我刚在变更日历里登记了，变更单号{chg}，你再试一次。", I, 3, [chg, "再试一次"])
        s.fact("change_id", chg, "id", "重启对应的变更单号是多少？")
        sched = {**sched, "change_id": chg}
    s.call("schedule_job", sched, K, 2, [svc, f"{nxt.isoformat()}T06:00:00+08:00"])
    s.tool({"job_id": job, "status": "scheduled", "at": f"{nxt.isoformat()}T06:00:00+08:00"}, K, 3, [job, "scheduled"])
    s.fact("job_id", job, "id", "重启任务的编号是多少？")
    s.call("add_ticket_note", {"ticket": ticket, "note": f"根因：logrotate 路径配置错误（/var/log/{svc}），access.log 涨到 "
                               f"{log_g}G 写满 /data。已将3天前日志备份到 oss://ops-backup/{svc}/ 并清理，/data 降到 46%；"
                               f"已修正 logrotate 配置；{svc} 重启已排期 {nxt.isoformat()} 06:00（{job}）。"},
           K, 1, [ticket])
    s.tool({"ticket": ticket, "status": "ok"}, K, 1, [ticket])
    s.say(f"处理小结（{ticket}）：根因是 logrotate 路径配错导致 access.log 写满磁盘；旧日志已备份到 oss://ops-backup/{svc}/"
          f" 并清理，/data 46%；logrotate 已修正；{svc} 重启排在明早6:00（任务 {job}）。数据库主库 {db} 没有动。"
          "以上都记在工单里了。", K, 3, [ticket, f"oss://ops-backup/{svc}/", "明早6:00", job])
    s.user("好，辛苦了。", F, 0)
    s.say("不客气，明早重启后我再确认一下指标。", F, 0)


# ------------------------------------------------------------------------------------------------
# 订餐 + 日程：包间已满、人数变更、会议室冲突、会议改时间
# ------------------------------------------------------------------------------------------------
ZH_RESTAURANTS = [("湘味小馆", "湘菜", True), ("粤港茶餐厅", "粤菜", False), ("江南春", "淮扬菜", False),
                  ("老北京涮肉坊", "火锅", False), ("川香阁", "川菜", True), ("潮汕砂锅粥", "潮汕菜", False),
                  ("金陵小厨", "淮扬菜", False), ("客家人家", "客家菜", False)]
ZH_AREAS = ["公司", "家", "奥体中心", "火车站", "滨江公园"]
ZH_PEOPLE = [("王磊", "wanglei"), ("李静", "lijing"), ("张伟", "zhangwei"), ("刘洋", "liuyang"), ("陈晨", "chenchen"),
             ("杨帆", "yangfan"), ("赵敏", "zhaomin"), ("黄涛", "huangtao"), ("周婷", "zhouting"), ("吴昊", "wuhao")]
ZH_ROOMS = ["长江", "黄河", "泰山", "华山", "西湖", "洞庭"]
ZH_TOPICS = ["下季度预算", "新版本上线计划", "618活动复盘", "招聘计划"]


def restaurant(s: Session, rng: random.Random, v: int) -> None:
    boss = zh_name(rng)
    sat = dt.date(2025, rng.randint(2, 11), 1)
    sat += dt.timedelta(days=(5 - sat.weekday()) % 7 + 7 * rng.randint(0, 2))
    n_old = rng.choice([6, 7, 8])
    n_new = n_old + rng.choice([2, 3])
    pp = rng.choice([150, 180, 200, 250])
    area = rng.choice(ZH_AREAS)
    spicy = [r for r in ZH_RESTAURANTS if r[2]]
    mild = [r for r in ZH_RESTAURANTS if not r[2]]
    r_spicy = rng.choice(spicy)
    r1, r2, r_exp = rng.sample(mild, 3)
    phone = rng.choice(["139", "186", "158"]) + digits(rng, 8)
    conf = f"DZ{digits(rng, 8)}"
    (a, a_py), (b, b_py) = rng.sample(ZH_PEOPLE, 2)
    room1, room2 = rng.sample(ZH_ROOMS, 2)
    topic = rng.choice(ZH_TOPICS)
    mon = sat + dt.timedelta(days=2)
    tue, wed, thu = (mon + dt.timedelta(days=k) for k in (1, 2, 3))
    ev = f"evt_{code(rng, 10, 'abcdefghijklmnopqrstuvwxyz0123456789')}"
    min_spend = rng.choice([1200, 1500, 1800])

    s.system(
        f"你是{boss}的私人助理，可以搜索餐厅、查询空位、订位，以及管理日程。订位前必须和用户确认日期、时间、人数和预订人"
        "姓名；日程信息不得透露给公司以外的人；所有时间均为北京时间。",
        3, ["订位前必须和用户确认日期、时间、人数和预订人姓名", "日程信息不得透露给公司以外的人", "所有时间均为北京时间"])
    s.user(f"帮我订{zh_day(sat)}晚上的位子，{n_old}个人，6点左右，要包间，人均不超过{pp}元。家里有老人，不要太辣的，"
           f"最好离{area}近一点。",
           I, 3, [zh_day(sat), f"{n_old}个人", "6点左右", "要包间", f"人均不超过{pp}元", "不要太辣的"])
    s.fact("date", zh_day(sat), "date", "聚餐订在哪天？")
    s.fact("no_spicy", "不要太辣的", "constraint", "对口味有什么要求？")
    s.fact("budget", f"人均不超过{pp}元", "constraint", "人均预算是多少？")
    s.say("好的！预订人写您的名字吗？留哪个电话？", R, 0)
    s.user(f"写我的名字就行，电话{phone}。", K, 2, [phone])
    s.fact("phone", phone, "phone", "订位留的电话是多少？")
    s.call("search_restaurants", {"near": area, "date": sat.isoformat(), "party_size": n_old, "private_room": True,
                                  "max_price_pp": pp}, R, 1, [area])
    s.tool([{"name": r_spicy[0], "cuisine": r_spicy[1], "price_pp": pp - 40, "private_room": True, "spicy": "重辣"},
            {"name": r1[0], "cuisine": r1[1], "price_pp": pp - 25, "private_room": True, "spicy": "不辣"},
            {"name": r2[0], "cuisine": r2[1], "price_pp": pp - 10, "private_room": True, "spicy": "微辣可调"},
            {"name": r_exp[0], "cuisine": r_exp[1], "price_pp": pp + 60, "private_room": True, "spicy": "不辣"}],
           K, 2, [r1[0], r2[0]])
    s.say(f"{r_spicy[0]}是{r_spicy[1]}，偏辣，{r_exp[0]}人均{pp + 60}元超预算，先排除。比较合适的是{r1[0]}（{r1[1]}，不辣，"
          f"人均约{pp - 25}元）和{r2[0]}（{r2[1]}，可以做微辣或不辣，人均约{pp - 10}元），都有包间。", R, 1, [r1[0], r2[0]])
    s.user(f"就{r1[0]}吧，6点。", I, 3, [r1[0], "6点"])
    s.call("check_availability", {"restaurant": r1[0], "date": sat.isoformat(), "time": "18:00", "party_size": n_old,
                                  "private_room": True}, R, 1, [r1[0], "18:00"])
    s.tool({"restaurant": r1[0], "available": False, "alternatives": ["17:00", "20:30"], "note": "包间已订满，大厅有位"},
           F, 1, ["包间已订满"])
    s.say(f"抱歉，{r1[0]}当天6点的包间已经订满了，只有5点或8点半的，大厅倒是有位。要不要看看{r2[0]}？", F, 1, ["包间已经订满"])
    s.user(f"老人吃饭早，8点半太晚了，5点又太早。那就{r2[0]}吧，还是6点，要包间，菜做不辣的。", I, 3,
           [f"那就{r2[0]}吧", "还是6点", "菜做不辣的"])
    s.fact("restaurant", r2[0], "name", "最后订的是哪家餐厅？")
    s.call("check_availability", {"restaurant": r2[0], "date": sat.isoformat(), "time": "18:00", "party_size": n_old,
                                  "private_room": True}, R, 1, [r2[0]])
    s.tool({"restaurant": r2[0], "available": True, "rooms": [{"name": "兰亭", "capacity": 10}]}, K, 1, ["兰亭"])
    s.user(f"哦对了，我弟弟一家也来，人数改成{n_new}个人。", I, 3, [f"人数改成{n_new}个人"])
    s.fact("party_size", f"{n_new}个人", "count", "聚餐一共多少人？", superseded=f"{n_old}个人")
    s.call("check_availability", {"restaurant": r2[0], "date": sat.isoformat(), "time": "18:00", "party_size": n_new,
                                  "private_room": True}, R, 1, [f'"party_size": {n_new}'])
    s.tool({"restaurant": r2[0], "available": True, "rooms": [{"name": "听雨轩", "capacity": 14, "min_spend": min_spend}]},
           K, 2, ["听雨轩", f'"min_spend": {min_spend}'])
    s.say(f"跟您确认一下：{r2[0]}，{zh_day(sat)}晚上6点，{n_new}位，包间「听雨轩」（最低消费{min_spend}元），预订人{boss}，"
          f"电话{phone}，备注有老人、菜品不辣。没问题的话我就下单了。", R, 1, ["听雨轩", f"最低消费{min_spend}元"])
    s.user("可以，订吧。", I, 2, ["订吧"])
    s.call("book_table", {"restaurant": r2[0], "date": sat.isoformat(), "time": "18:00", "party_size": n_new,
                          "room": "听雨轩", "name": boss, "phone": phone, "notes": "有老人，菜品不辣"},
           K, 2, [r2[0], "听雨轩", boss, phone])
    s.tool({"confirmation": conf, "restaurant": r2[0], "room": "听雨轩", "time": f"{sat.isoformat()} 18:00",
            "party_size": n_new, "keep_until": "18:30"}, K, 3, [conf, '"keep_until": "18:30"'])
    s.fact("confirmation", conf, "id", "餐厅的预订确认号是多少？")
    s.say(f"订好了：{r2[0]}包间「听雨轩」，{zh_day(sat)}晚上6点，{n_new}位，确认号{conf}。包间保留到6点半，"
          "晚到的话记得提前打电话。", K, 3, [r2[0], "听雨轩", conf])
    if v % 2 == 0:
        s.user(f"顺便问一下，{r2[0]}有什么招牌菜吗？", F, 0)
        s.say("评价里提得比较多的是他们的汤和点心，具体可以到时候问问服务员的推荐。", F, 0)
    s.user(f"另外帮我约一下下周和{a}、{b}的会，1个小时，讨论{topic}。不要安排在周一上午，下午4点以后也不行，"
           f"订{room1}会议室。", I, 3, [f"{a}、{b}", "1个小时", topic, "不要安排在周一上午", "下午4点以后也不行", f"订{room1}会议室"])
    s.fact("meeting_topic", topic, "name", "下周的会议讨论什么？")
    attendees = [f"{a_py}@company.cn", f"{b_py}@company.cn"]
    s.call("find_free_slots", {"attendees": attendees, "duration_min": 60, "from": mon.isoformat(),
                               "to": (mon + dt.timedelta(days=4)).isoformat(), "not_after": "16:00", "room": room1}, R, 1)
    s.tool([{"start": f"{mon.isoformat()}T14:00"}, {"start": f"{tue.isoformat()}T14:00"},
            {"start": f"{wed.isoformat()}T10:00"}, {"start": f"{thu.isoformat()}T15:00"}],
           K, 2, [f"{tue.isoformat()}T14:00", f"{wed.isoformat()}T10:00"])
    s.say(f"三位和{room1}会议室都有空的时间：{zh_day(mon)}下午2点、{zh_day(tue)}下午2点、{zh_day(wed)}上午10点、"
          f"{zh_day(thu)}下午3点。您看哪个合适？", R, 1)
    s.user("周二下午2点吧。", I, 3, ["周二下午2点"])
    event = {"title": f"{topic}讨论", "start": f"{tue.isoformat()}T14:00", "duration_min": 60, "room": room1,
             "attendees": attendees}
    room = room1
    if v % 2 == 0:
        s.call("create_event", event, F, 0)
        s.tool(f"Error: 会议室「{room1}」在 {tue.isoformat()} 14:00-15:00 已被占用", F, 1, ["已被占用"])
        s.say(f"抱歉，{room1}会议室刚被别人订走了。同一时段{room2}会议室还空着，可以换成{room2}吗？", F, 1, [room2])
        s.user(f"行，换{room2}。", I, 3, [f"换{room2}"])
        s.fact("room", room2, "name", "会议在哪个会议室？", superseded=room1)
        room = room2
        event = {**event, "room": room2}
    s.call("create_event", event, K, 2, [f"{tue.isoformat()}T14:00", room])
    s.tool({"event_id": ev, "status": "created", "room": room}, K, 3, [ev])
    s.say(f"会议已经约好：{zh_day(tue)}下午2点到3点，{room}会议室，已给{a}和{b}发了邀请。", K, 2, [zh_day(tue), room])
    s.user(f"{a}说周二下午有事，改到周三上午10点吧。", I, 3, ["改到周三上午10点"])
    s.fact("meeting_time", "周三上午10点", "time", "会议改到了什么时候？", superseded="周二下午2点")
    s.call("update_event", {"event_id": ev, "start": f"{wed.isoformat()}T10:00"}, K, 2, [ev, f"{wed.isoformat()}T10:00"])
    if v == 1:
        s.tool(f"Error: 会议室「{room}」在 {wed.isoformat()} 10:00-11:00 已被占用", F, 1, ["已被占用"])
        other = next(r for r in ZH_ROOMS if r not in (room1, room2))
        s.say(f"抱歉，周三上午10点{room}会议室有人用了。{other}会议室那个时间是空的，我先帮您换过去可以吗？", F, 1, [other])
        s.user(f"可以，换到{other}。", I, 3, [f"换到{other}"])
        s.fact("room", other, "name", "会议在哪个会议室？", superseded=room1)
        room = other
        s.call("update_event", {"event_id": ev, "start": f"{wed.isoformat()}T10:00", "room": room}, K, 2, [ev, room])
    s.tool({"event_id": ev, "status": "updated", "start": f"{wed.isoformat()}T10:00", "room": room}, K, 3,
           [f"{wed.isoformat()}T10:00", room])
    s.say(f"改好了：会议改到{zh_day(wed)}上午10点，{room}会议室，{a}和{b}都收到了更新通知。", K, 3, [zh_day(wed), room])
    s.user("好的，谢谢！", F, 0)
    s.say("不客气～周六聚餐愉快！", F, 0)
