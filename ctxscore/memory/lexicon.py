"""English and Chinese cue patterns shared by the context types, the user profile and the verifier.

Each pattern is a compiled regular expression over message text. ASCII cues match
case-insensitively on word boundaries; Chinese cues match as substrings. The lists are the rules'
vocabulary, kept in one place so the three layers read a message the same way.
"""

from __future__ import annotations

import re


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


#: A task statement handed to an agent (mini-SWE-agent's ``<pr_description>``, "your task is" ...): in
#: the first :data:`TASK_STATEMENT_CHARS` characters of a user message that is no tool observation
#: (:data:`OBSERVATION_HEAD`) it opens a task (:func:`ctxscore.window.tasks.starts_task`) and, pinned,
#: is never released while its task is active (:meth:`ctxscore.window.history.History.release_instructions`);
#: it is also a context-type signal (:func:`ctxscore.memory.context_types.type_signals`).
TASK_STATEMENT = re.compile(r"<pr_description>|<issue>|(?i:please solve this issue|your task is|## task)")
#: Characters of a message's start searched for :data:`TASK_STATEMENT`.
TASK_STATEMENT_CHARS = 2000
#: A tool observation sent as a user message (mini-SWE-agent's ``<returncode>`` / ``<output>``), read in
#: the first 200 characters: not the user speaking.
OBSERVATION_HEAD = re.compile(r"<returncode>|^\s*<output")
OBSERVATION_HEAD_CHARS = 200

#: A negation inside a sentence (the verifier compares them before and after compression).
NEGATION = _rx(r"\b(?:not|no|never|none|nothing|nobody|without|don'?t|doesn'?t|didn'?t|won'?t|can'?t|cannot|"
               r"isn'?t|aren'?t|wasn'?t|shouldn'?t|mustn'?t|neither|nor)\b|"
               r"(?<![要是能好可对会行])不(?![错过少如同久断仅管然停客好])|别|没(?!问题)|无法|禁止|勿|未(?!来)")
#: A prohibition: the negated verb phrase of a hard constraint ("don't recommend Apple", "不要退成余额").
PROHIBITION = _rx(r"\b(?:don'?t|do not|never|must not|mustn'?t|should not|shouldn'?t|no more|not allowed to|"
                  r"cannot|can'?t|under no circumstances|avoid)\b\s*(?:ever\s+)?|(?<![a-z])no\s+(?=[a-z])|"
                  r"不要|别|禁止|不得|千万别|绝对不|(?<!能)不能(?!不)|不许|不准|不想要?|不考虑")
#: The user affirms what the assistant just said or offered.
AFFIRM = _rx(r"^\W*(?:(?:oh|ah|well|um|hmm|great|alright)\W+)?(?:yes|yeah|yep|yup|sure|ok(?:ay)?|correct|right|exactly|perfect|great|fine|sounds (?:good|great|"
             r"perfect|fine)|that (?:works|will work|would work|sounds good|is (?:right|correct|fine))|(?:that )?works for me|that'?ll work|will do|that's (?:right|correct|fine|good|"
             r"perfect|great)|go ahead|please do|do it|book it|confirm(?:ed)?|i confirm|proceed|let's do (?:it|that)|"
             r"i'll take (?:it|that|them)|that one)\b|^\W*(?:是的|对|好的?|可以|行|没错|确认|就这个|就这样|改吧|订吧|嗯)")
#: The user turns an offer down or asks for another one.
REJECT = _rx(r"\b(?:i don'?t (?:think i )?(?:want|like) (?:that|those|this|it|them)|not (?:that|this) one|"
             r"(?:try|find|show me|give me|any|something|what about) (?:another|other|else|different)|"
             r"another (?:one|option|airline|hotel|restaurant|flight|place)|other options?|something else|"
             r"move on to another|no,? (?:thanks|that'?s not)|too (?:expensive|far|late|early|pricey)|"
             r"i'?d rather not)\b|不要这个|不想要这个|换一[个家]|还有别的|还有其他|有没有别的|太贵|不喜欢这个|不合适")
#: Resignation: accepting something without liking it ("fine, I guess", "算了就这个吧").
RESIGN = _rx(r"\b(?:i guess|fine,? (?:then|i'?ll)|whatever|if (?:that'?s|it'?s) (?:all|the only)|only option|"
             r"no choice|i suppose|settle for|have to do|it'?ll have to do|ok(?:ay)?,? then)\b|"
             r"算了|凑合|将就|只能|那就这个吧?|那就这样吧?|行吧|好吧|没办法")
#: A first-person statement of what the user likes, wants in general, or avoids.
PREF_POS = _rx(r"\b(?:i (?:really |usually |always |generally |do )?(?:like|love|prefer|enjoy|adore)|i'?d (?:rather|prefer)|"
               r"i'?m (?:a (?:big |huge )?fan of|into)|my favou?rite (?:\w+ )?is|i usually (?:go for|take|get|book|pick)|"
               r"i always (?:go for|take|get|book|pick|fly|choose)|i'?m (?:a |an )?(?=vegetarian|vegan|pescatarian|halal|kosher))\s*|"
               r"我(?P<gap>[^，。！？,.!?]{0,6}?)(?:很|比较|特别|非常|一直|一般|平时|通常|最)?(?:喜欢|爱(?!人)|偏好|偏爱|习惯)")
PREF_NEG = _rx(r"\b(?:i (?:really )?(?:don'?t|do not|never) (?:like|want|eat|drink|use|fly|enjoy)|i (?:hate|dislike|"
               r"can'?t stand)|i'?m (?:done with|tired of|sick of|not a fan of|allergic to)|"
               r"(?:don'?t|do not|never) (?:recommend|suggest|offer|show|give)(?: me)?|no more)\s+|"
               r"我(?:很|比较|特别|一直|最近|平时)?(?:不喜欢|不爱|讨厌|不想用|不想要|不吃|不喝|受够了|对)|"
               r"(?:不要|别)(?:再)?(?:给我)?(?:推荐|介绍|发)")
#: The user's own allergy: "I'm allergic to peanuts" (the allergens in ``what``), "I have a severe
#: peanut allergy" (``thing``), 我对花生过敏 / 我有点花粉过敏 (``zwhat``).
ALLERGY = _rx(r"\b(?:i'?m|i am|we'?re|we are)\s+(?:(?:very|severely|seriously|highly|extremely|deathly|mildly|slightly|"
              r"also|really)\s+)*allergic to\s+(?P<what>[^.;:!?]+)|\b(?:i|we)(?: have| have got|'ve got|'ve)\s+"
              r"(?:an?\s+)?(?:(?:severe|serious|bad|mild|slight|life-threatening|deadly|strong)\s+)*"
              r"(?P<thing>[a-z][a-z ,-]{0,40}?)\s+allerg(?:y|ies)\b|"
              r"我(?:们)?(?:有点|有|对)?(?P<zwhat>[\u4e00-\u9fff、和]{1,8}?)(?:严重|有点|很|特别|非常)?过敏")
#: The user rules out what to book ("Never book Ryanair", "don't put us on EasyJet", 也不要订东方航空, 别坐国航):
#: the object follows the cue.
AVOID_BOOKING = _rx(r"\b(?:never|don'?t|do not)\s+(?:ever\s+)?(?:book|reserve|fly|put (?:me|us) on)\s+"
                    r"(?:(?:with|on|us|me)\s+){0,2}|(?:不要|别|千万别|千万不要|绝对不要|不准|不许)(?:再)?(?:给|帮|为)?(?:我们|我)?"
                    r"(?:预订|预定|订|乘坐|坐|入住|住)")
#: The statement holds for now / this time only (a current-task scope).
TEMPORARY = _rx(r"\b(?:for now|this time|right now|at the moment|currently|these days|lately|for this (?:trip|order|"
                r"purchase|task|booking)|just this once|today)\b|最近|这次|这一次|本次|暂时|目前|当前|现在先")
#: The statement holds in general (a session-level scope at least).
GENERAL = _rx(r"\b(?:always|usually|generally|in general|every time|whenever|never|normally|as a rule|all my)\b|"
              r"一直|总是|平时|通常|一般都|每次|向来|从来")
#: The user says a preference changed ("I've switched to ...", "不再 ...").
CHANGE = _rx(r"\b(?:i'?ve switched|i switched|switched to|not anymore|no longer|these days i prefer|i changed my mind|"
             r"i used to)\b|不再|改成|换成了|现在改|以前.{0,6}现在")
#: Who a person is to the user (the people table).
RELATION = _rx(r"\bmy (?P<rel>wife|husband|partner|girlfriend|boyfriend|son|daughter|kids?|children|mother|mom|mum|"
               r"father|dad|brother|sister|boss|manager|colleague|coworker|co-worker|friend|best friend|grandmother|"
               r"grandfather|grandma|grandpa|assistant|client|roommate|neighbou?r|aunt|uncle|cousin|team ?lead)\b"
               r"(?:,?\s+(?:named\s+|called\s+)?(?P<name>(?-i:[A-Z][a-z]+(?: [A-Z][a-z]+)?)))?|"
               r"我(?:的)?(?P<zrel>老婆|老公|妻子|丈夫|太太|先生|女朋友|男朋友|儿子|女儿|孩子|妈妈|母亲|爸爸|父亲|哥哥|姐姐|弟弟|妹妹|"
               r"老板|领导|同事|朋友|室友|邻居|奶奶|爷爷|外婆|外公|客户|助理)(?:(?:叫|是)?(?P<zname>(?![一也都和要说在的是这那他她特最很非比就还])[\u4e00-\u9fff]{2,3}?(?=[，,。.\s和也要想喜爱是说在的不]|$)))?")
#: Basic facts about the user ("I'm 34", "I live in Leeds", "我是学生").
BASIC = _rx(r"\b(?:i'?m (?P<age>\d{1,2}) (?:years old|yo)\b|i live in (?P<city>(?-i:[A-Z][a-z]+(?: [A-Z][a-z]+)?))|"
            r"i'?m an? (?P<job>student|teacher|doctor|nurse|developer|engineer|designer|lawyer|retiree|freelancer|"
            r"programmer|data scientist|manager)\b|i'?m an? (?P<tier>gold|silver|platinum|bronze|regular|premium) member)|"
            r"我今年(?P<zage>\d{1,2})岁|我住在(?P<zcity>[\u4e00-\u9fff]{2,4})|我是(?P<zjob>学生|老师|医生|护士|程序员|工程师|设计师|"
            r"律师|退休|自由职业|产品经理|会员|新手)")
#: What the user can or cannot do / knows ("I'm new to Python", "我不太懂").
ABILITY = _rx(r"\b(?:i'?m (?:new to|a beginner (?:at|in|with)|not (?:very )?familiar with|not good at|good at|"
              r"experienced (?:with|in)|an expert (?:in|at|on))|i don'?t know (?:much|anything) about|i (?:can'?t|cannot) "
              r"(?:read|drive|code|program|swim|cook))\s+|我(?:是)?(?:新手|小白)|我不太?(?:懂|会|熟悉)|我(?:很)?(?:擅长|熟悉)")
#: A long-term goal of the user (not the goal of the current task).
LIFE_GOAL = _rx(r"\b(?:my goal is to|i'?m trying to|i want to (?:learn|improve|get better at|lose|save)|"
                r"i'?m (?:saving|training) for)\s+|我的目标是|我(?:正在|在)(?:学|准备|存钱|减肥)|我想(?:学会|提高|减肥|存钱)")
#: A decision style ("I always pick the cheapest").
DECISION_STYLE = _rx(r"\b(?:i (?:always|usually) (?:pick|choose|go with|take) the (?P<what>cheapest|fastest|"
                     r"shortest|closest|best[- ]rated|earliest|latest)|price (?:matters|is what matters) most)\b|"
                     r"我(?:一般|通常|总是)?(?:都)?(?:选|挑)(?P<zwhat>最便宜|最快|最近|评分最高|最早)")
#: The user states a goal or asks for something (a request or an intent).
INTENT = _rx(r"\b(?:(?:i|we)(?:'d| would)? (?:also |really |just |still )?(?:want|need|like) (?:to|a|an|the|some)|"
             r"(?:i|we)'?d (?:also |really )?love (?:to|a|an|the|some)|(?:i'?m|we'?re) looking for|can you|could you|"
             r"would you|please|help me|find me|book me|get me|show me|(?:i'?m|we'?re) hoping|looking to|(?:i|we) plan to|"
             r"(?:i'?m|we'?re|i am|we are) planning|"
             r"your task is)\b|帮我|我想|我要|想要|需要|请|麻烦|能不能|可以帮|给我找|推荐")
#: A plan or a list of steps ("First, ... then ...", "1. ... 2. ...", "THOUGHT:").
PLAN = _rx(r"(?m)^\s*(?:\d+[.)]|[-*] |step \d)|\b(?:first,? i'?ll|then i'?ll|next,? i'?ll|my plan|the plan is|"
           r"let me|i'?ll (?:start|check|look|first|run|search)|i will (?:now|first|next)|thought:)|首先|然后|接下来|下一步|计划|步骤")
#: The assistant reports something as done.
SUCCESS = _rx(r"\b(?:done|all set|booked|reserved|confirmed|cancell?ed|updated|changed|modified|refunded|"
              r"processed|submitted|completed|successfully|has been|have been|is now|are now|went through|"
              r"i'?ve (?:booked|cancell?ed|updated|changed|made|placed|processed|submitted|reserved|sent|applied)|"
              r"tests? (?:now )?pass(?:es|ed)?|all tests pass)\b|已(?:经)?(?:为您|帮您)?(?:预订|预定|订好|取消|修改|改好|更新|"
              r"提交|退款|办理|完成|处理)|成功|改好了|办好了|订好了|搞定")
#: The sentence reports a failure (a success cue inside it does not count).
FAILED = _rx(r"\b(?:sorry|unfortunately|failed|fail|couldn'?t|could not|didn'?t|did not|unable|not (?:go|gone) through|"
             r"error|cannot|can'?t|wasn'?t|weren'?t|not been|not yet|isn'?t)\b|失败|没有成功|未能|无法|不能|没能|出错|抱歉")
#: The assistant says it acts or has acted ("I'll book", "I have booked", "已为您预订").
ACTION = _rx(r"\b(?:i'?ll (?:book|reserve|cancel|change|modify|update|order|buy|purchase|send|schedule|submit|apply)|"
             r"i (?:have|'ve) (?:booked|reserved|cancell?ed|changed|modified|updated|ordered|bought|purchased|sent|"
             r"scheduled|submitted|applied)|i am (?:booking|reserving|cancell?ing|changing|ordering)|i'?m (?:booking|"
             r"reserving|cancell?ing|changing|ordering)|booking (?:you|it|the)|your (?:\w+ )?(?:is|has been) "
             r"(?:booked|reserved|confirmed|scheduled))\b|(?:我)?(?:已|已经|马上|这就|现在)?(?:为您|帮您|给您)(?:预订|预定|订|改|修改|取消|下单|购买|提交|办理)")
#: The assistant offers something and asks whether the user takes it.
OFFER = _rx(r"\b(?:would you like|shall i|should i|do you want|does that work|is that (?:ok|okay|fine|alright)|"
            r"how about|what about|i (?:can|could) (?:book|offer|reserve)|please confirm|can you confirm|"
            r"confirm (?:that|the|your)|would that work|sound good)\b|要不要|可以吗|好吗|行吗|您看|确认一下|对吗|怎么样|"
            r"(?:需要|要)(?:[帮为]您)?预?[订定]吗|确认吗")
#: The assistant recommends or proposes something.
PROPOSE = _rx(r"\b(?:i (?:would )?(?:recommend|suggest)|how about|what about|i found|there is|there'?s|we have|"
              r"you (?:could|might|can) (?:try|take|go with)|my (?:top )?pick is|option|would you like)\b|"
              r"推荐|建议|为您找到|找到了|有一[家个款间套张]|可以考虑|要不要")
#: The assistant attributes a statement to the user ("as you said", "您确认过").
ATTRIBUTION = _rx(r"\b(?:as you (?:said|mentioned|requested|asked|confirmed|told me|wanted)|you (?:said|told me|mentioned|"
                  r"confirmed|requested|asked for|chose|agreed|selected|specified|indicated|wanted)|you'?ve (?:confirmed|"
                  r"said|chosen|agreed)|per your (?:request|confirmation|instructions)|since you (?:want|prefer|said|need)|"
                  r"based on your (?:confirmation|request|preference))\b|(?:按照|按|根据|依照)您的(?:要求|确认|说法|选择)|您(?:刚才)?(?:说过|说的|提到过|"
                  r"确认过|确认了|要求过|选择了|同意了|指定了)|如您所说")
#: An assistant guess ("probably", "I assume").
GUESS = _rx(r"\b(?:probably|i assume|i guess|likely|i think|perhaps|maybe|it seems|might be|presumably)\b|可能|估计|应该是|大概|也许")
#: Write-like tool names: a call that changes the world (high risk; checkpoints go before them).
WRITE_TOOL = _rx(r"(?:^|_|\b)(?:book|reserve|cancel|update|modify|change|exchange|return|refund|delete|remove|send|pay|"
                 r"transfer|create|submit|upgrade|purchase|buy|order|write|edit|apply|rm|drop|deploy|restart|kill|"
                 r"place|add)(?:_|\b|$)")
#: A high-risk shell command inside a tool call or an agent's action.
RISKY_COMMAND = _rx(r"\brm\s+-\w*[rf]|\bgit\s+(?:push|reset\s+--hard|clean\s+-\w*f)|\bdrop\s+(?:table|database)\b|"
                    r"\bkubectl\s+delete\b|\bsystemctl\s+(?:restart|stop)\b|\bshutdown\b|\bmkfs\b|\bdd\s+if=")
#: Closing words for a finished task ("that's all", "再见").
CLOSING = _rx(r"\b(?:that'?s all|that is all|that'?s it|nothing else|bye|goodbye|have a (?:nice|good|great) day)\b|再见|没事了|就这些|没有其他")
