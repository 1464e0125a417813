"""The phrase and syntax rules of screening, by :class:`~schemas.bcp.AnomalyCode`.

Each table is a tuple of ``(pattern, detail)``; :func:`~peers.gateway.screening.screen` reports
the first rule of a table that matches. Patterns run on the folded text
(:func:`~peers.gateway.folding.fold_for_screening`: casefolded, one line per raw line so that
``^`` finds a role marker, disguised key words written plainly).

The instruction rules aim at language *addressed to whoever reads the answer*, the way a prompt
is: overriding earlier instructions, redefining the reader's role, talking about its prompt,
telling it what to put in its response, what to run or whom to tell; in English and, for the
commonest shapes, in Spanish, French, German, Portuguese, Italian, Dutch, Polish, Turkish,
Indonesian, Albanian, Irish, Scottish Gaelic, Zulu, Russian, Chinese and Japanese. Words that
ordinary prose uses alone ("you must", "ignore", "respond with", "system") are findings only in
those shapes: "You must watch the pot" is not one, "you must ignore the rules above" is.

Code rules look for executable syntax (calls with string arguments, shell pipelines, SQL
injections, event-handler attributes, JSON objects and tool-call syntax), not for the mention of
a function's name.

**Linear time.** Every repetition that can start at many places is bounded (``{0,200}``, or a
gap of at most a few words), so that no pattern backtracks more than a constant per position:
``tests/peers/gateway/test_screening.py`` times each one on hostile inputs of growing length.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["CODE", "INSTRUCTION", "MARKUP", "URL", "Rules"]

Rules = tuple[tuple[re.Pattern[str], str], ...]


def _rules(*pairs: tuple[str, str]) -> Rules:
    return tuple((re.compile(_factor(pattern), re.MULTILINE), detail) for pattern, detail in pairs)


def _factor(pattern: str) -> str:
    r"""Rewrite ``\bA|\bB|C`` as ``\b(?:A|B)|C``: the same matches, found about 3x faster.

    Python's engine tries every alternative at every position; one shared word boundary in
    front lets it skip the positions inside words at once.
    """
    alternatives = _split_top(pattern)
    bounded = [alt[2:] for alt in alternatives if alt.startswith(r"\b")]
    if len(bounded) < 2:
        return pattern
    rest = [alt for alt in alternatives if not alt.startswith(r"\b")]
    return "|".join([rf"\b(?:{'|'.join(bounded)})", *rest])


def _split_top(pattern: str) -> list[str]:
    """Split ``pattern`` at the ``|`` that are outside groups and character classes."""
    parts, depth, start, index, in_class = [], 0, 0, 0, False
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            if pattern[index + 1 : index + 2] == "]":  # a class that starts with "]"
                index += 1
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "|" and depth == 0:
            parts.append(pattern[start:index])
            start = index + 1
        index += 1
    parts.append(pattern[start:])
    return parts


def _any(*words: str) -> str:
    return "(?:" + "|".join(words) + ")"


# A gap of up to N words between two parts of a phrase: "ignore [all of the] previous".
def _gap(words: int) -> str:
    return rf"(?:\W{{1,5}}[\w'’-]{{1,30}}){{0,{words}}}\W{{1,5}}"


_AI = _any(
    "ai",
    "a\\.i\\.",
    "assistant",
    "agent",
    "model",
    "llm",
    "chatbot",
    "bot",
    "gpt(?:-?\\d\\w*)?",
    "chatgpt",
    "claude",
    "gemini",
    "bard",
    "copilot",
    "controller",
    "language model",
)
_OVERRIDE = _any(
    "ignore",
    "disregard",
    "forget",
    "override",
    "bypass",
    "abandon",
    "discard",
    "dismiss",
    "neglect",
    "overlook",
    "let go of",
)
_EARLIER = _any(
    "previous",
    "prior",
    "above",
    "earlier",
    "preceding",
    "original",
    "initial",
    "system",
    "before",
    "existing",
    "old",
    "former",
)
_ORDERS = _any(
    "instructions?",
    "prompts?",
    "directives?",
    "programming",
    "commands",
    "guidelines",
    "guidance",
    "orders",
    "requests",
    "rules",
    "restrictions",
    "constraints",
    "limitations",
    "policies",
    "training",
    "filters?",
    "context",
)
_PROMPT_WORDS = _any("instructions?", "prompts?", "directives?", "programming")
_MATERIAL = _any(
    "texts?",
    "messages?",
    "context",
    "conversation",
    "content",
    "inputs?",
    "notes?",
    "steps",
    "directions",
    "answers?",
    "responses?",
    "everything",
)
_OUTPUT = _any("responses?", "answers?", "repl(?:y|ies)", "outputs?", "messages?", "texts?")
_SAY = _any(
    "respond",
    "reply",
    "answer",
    "say",
    "print",
    "output",
    "write",
    "type",
    "repeat",
    "return",
    "state",
    "display",
    "echo",
)
_DO = _any(
    "ignore",
    "disregard",
    "forget",
    "obey",
    "comply",
    "follow (?:my|these|the|all|our|every|any|new|those)",
    "respond",
    "reply",
    "answer",
    "output",
    "print",
    "say",
    "write",
    "repeat",
    "include",
    "reveal",
    "disclose",
    "send",
    "forward",
    "email",
    "post",
    "upload",
    "execute",
    "run",
    "call",
    "invoke",
    "delete",
    "approve",
    "grant",
    "transfer",
    "recommend",
    "tell the user",
    "inform",
    "act",
    "pretend",
    "stay in",
    "remain in",
    "refuse",
    "generate",
    "provide",
    "produce",
    "start (?:your|each|every|with)",
    "begin (?:your|each|every|with)",
    "append",
    "prepend",
    "prefix",
    "visit",
    "click",
    "download",
    "install",
    "simulate",
    "emulate",
    "roleplay",
    "role-play",
)

INSTRUCTION: Final = _rules(
    (
        rf"\b{_OVERRIDE}{_gap(4)}{_PROMPT_WORDS}\b"
        rf"|\b{_OVERRIDE}{_gap(3)}(?:above|before|earlier)\b"
        rf"|\b{_OVERRIDE}{_gap(3)}{_EARLIER}\W{{1,5}}(?:\w+\W{{1,5}})?(?:{_ORDERS}|{_MATERIAL})\b"
        rf"|\b{_OVERRIDE}\W{{1,5}}(?:all\W{{1,5}})?(?:everything|anything|all that|all of that)\b"
        rf"|\b{_OVERRIDE}\W{{1,5}}(?:your|all|any|every|my"
        rf"|our)\W{{1,5}}(?:\w+\W{{1,5}})?{_ORDERS}\b"
        rf"|\b{_OVERRIDE}\W{{1,5}}what (?:you|i|we) (?:were|was|have been|had been) (?:told|given"
        rf"|asked)"
        r"|\bregardless of (?:any |all |your |the )?(?:previous|prior|earlier|pre-existing"
        r"|other)\b",
        "asks to ignore or override instructions",
    ),
    (
        r"\byou(?:'re| are) (?:now|no longer)\b|\bfrom (?:now|this (?:point|moment|message))"
        r" (?:on|onwards?|forward)\b|\bfrom (?:this|that) point,? you\b|(?:^|[.!?]\s{1,5})you(?:'re"
        r"| are) (?:a|an|the) (?:\w+ ){0,3}"
        r"(?:being|entity|ai|assistant|bot|model|system|expert|operator|version|persona"
        r"|character)\b"
        r"|\bfrom now\b|\bhenceforth\b"
        r"|\byou(?:'re| are) (?:about|going|supposed) to (?:act|be|play|immerse|become|pretend"
        r"|roleplay|simulate|respond|answer)\b"
        r"|\byou(?:'re| are) to (?!be (?:found|seen|expected)\b)\w+\b"
        r"|\b(?:act|acting) (?:as though|as if|out)\b|\blet'?s (?:act|pretend|imagine|roleplay)\b"
        r"|\byou (?:will|shall|must|should) (?:now |always |only |never )?(?:act|respond|answer"
        r"|reply|pretend|roleplay|simulate|obey|comply|behave|stay|remain|refer to yourself)\b"
        r"|\bimmers(?:e|ing) yourself\b|\b(?:stay|remain|keep|break|breaking) (?:in |out of )?"
        r"character\b|\bstay(?:ing)? in (?:the )?(?:\w+ )?character\b|\binto the role of\b"
        r"|\b(?:take|taking) on the (?:role|persona)\b"
        rf"|\bplay(?:ing)? the role of (?:an? )?(?:\w+ ){{0,2}}{_AI}\b"
        r"|\bassume the (?:role|persona|identity)\b|\byour (?:new )?name is\b|\bgo by the name\b"
        r"|\byou (?:will|shall|now) go by\b|\bi want you to\b|\bi need you to (?:act|be|pretend)\b"
        rf"|\byou(?:'re| are) (?:an? )?(?:\w+ ){{0,3}}{_AI}\b(?! (?:research|safety|model))",
        "tries to redefine the reader's role",
    ),
    (
        r"\b(?:act|behave|respond|answer|reply|speak|write) (?:as|like) (?:an? |the )"
        r"(?:\w+ ){0,2}(?:unrestricted|unfiltered|uncensored|different|evil|amoral|unethical"
        r"|unbound|unlimited|jailbroken)\b"
        rf"|\b(?:act|answer|respond|reply) as (?:an? |the )?(?:\w+ ){{0,2}}{_AI}\b"
        rf"|\bpretend (?:that )?(?:you|to be (?:an? )?(?:\w+ ){{0,2}}{_AI})\b"
        r"|\brole-?play(?:ing)? (?:as|with me)\b|\bsimulat(?:e|ing) (?:an? )?(?:\w+ ){0,2}"
        rf"{_AI}\b|\b(?:un(?:filtered|censored|restricted|bound)|amoral|jailbroken) "
        rf"(?:\w+ ){{0,2}}{_AI}\b",
        "asks to play a role",
    ),
    (
        r"\b(?:your|new|updated|following|hidden|real|this|my) system (?:prompt|message"
        r"|instructions?|note|override)\b"
        r"|\bsystem (?:prompt|message|instructions?|note|override)\s{0,3}(?:is\s{0,3})?[:=]"
        r"|\b(?:show|repeat|print|reveal|display|output|give|tell|share|dump|leak|copy|recite"
        r"|translate|summari[sz]e|what is|what's|everything in)\b[^.\n]{0,40}\bsystem (?:prompt"
        r"|message|instructions?|configuration)\b|\b(?:administrator|admin|root) override\b"
        r"|\bdeveloper (?:mode|message)\b"
        r"|\bjailbr(?:eak|oken)|\bdan mode\b|\bdo anything now\b"
        r"|\byour (?:\w+ )?(?:initial|original|hidden|secret|system|first|starting|underlying"
        r"|internal|full|previous|prior|real|true) (?:instructions?|prompts?|configuration|rules"
        r"|message|directives?|guidelines|programming)\b"
        r"|\b(?:initial|original|hidden|secret) (?:instructions|prompt)\b"
        r"|\bwhat (?:were|was|have) you (?:been )?(?:told|given|instructed|asked)\b"
        r"|\bwhat are your (?:instructions|rules|guidelines|directives)\b"
        r"|\bi (?:was|have been) (?:instructed|told) (?:to|not to)\b"
        r"|\byou (?:were|have been) (?:instructed|told|programmed) (?:to|not to)\b"
        r"|\b(?:repeat|print|output|show|reveal|display|recite|dump|echo|translate|encode|spell"
        r"|summari[sz]e|output) (?:\w+ ){0,3}(?:text|words|instructions|prompt|message"
        r"|conversation|everything)s? (?:above|before|so far|you were given)\b"
        r"|\b(?:repeat|print|output|show|reveal|display|recite|translate|summari[sz]e) (?:the "
        r"|all )?"
        r"(?:above|previous|preceding|initial|original|first) (?:\w+ )?(?:text|words|instructions"
        r"|prompt|message|conversation|string)s?\b|\binitiali[sz]ation (?:string|prompt|text)\b"
        r"|\b(?:you (?:are|were)|are you) not (?:supposed|allowed|permitted) to\b"
        r"|\bword for word\b|\bverbatim\b|\binsert (?:your )?prompt here\b|\bprompt ?="
        r"|\[(?:insert|your|put|enter|write) [^\]\n]{0,40}\]",
        "talks about the prompt itself",
    ),
    (
        r"^\W{0,5}\[?(?:system|assistant|user|human|ai|developer|dan|gpt|chatgpt|jailbreak)"
        r"(?: message| prompt| note)?\]?\s*[:>]|<\|[a-z_]+\|>|\[/?inst\]|<</?sys>>"
        r"|(?<!#)#{2,}\W{0,5}(?:instruction|system|response|user|assistant|input|output|prompt)"
        r"|\[(?:system|assistant|user|inst|sys|instruction|developer|admin)[^\]\n]{0,30}\]"
        r"|<\s*/?\s*(?:system|assistant|user|instructions?|prompt|im_start|im_end)\b",
        "contains a chat role marker",
    ),
    (
        rf"\b(?:dear|attention|hey|hello|hi|greetings|listen|note to(?: the)?)\W{{1,5}}{_AI}\b"
        r"|\b(?:as|you are) an? (?:ai|language model|llm)\b"
        rf"|(?:^|[.!?]\s+){_AI}\s*[,:]\s+\w",
        "addresses an AI",
    ),
    (
        rf"\byou (?:must|should|need to|have to|are required to|will now|shall|are to|will)"
        rf" (?:now |immediately |also |always |only |then |first )?{_DO}\b"
        r"|(?:^|[.!?]\s{1,5})(?:act as|act like|pretend|personify|impersonate|imagine you|roleplay"
        r"|role-play|simulate|write (?:a|an|me) (?:\w+ ){0,2}(?:story|poem|essay|letter|guide"
        r"|script|song|rap|scene|dialogue|speech|article|post|review))\b"
        rf"|\byou(?:'ll| will) (?:always |only |never )?(?:answer|respond|reply|act|obey|comply)\b"
        r"|\byou (?:must|should|will|shall) (?:not|never) (?:reveal|mention|tell|disclose|refuse"
        r"|inform|warn|apologi[sz]e|break character|deny|remind)\b"
        rf"|\b(?:in|into|to|of|for|within|inside|at the (?:end|start|beginning|top|bottom) of) your"
        rf" (?:\w+ )?{_OUTPUT}"
        rf"|\b(?:each|every|all) (?:of )?(?:your|the) (?:future )?{_OUTPUT}\b"
        rf"|\b(?:start|begin|end|prefix|preface|prepend|format|conclude) (?:each |every |all )?"
        rf"(?:of )?your {_OUTPUT}"
        rf"|\b{_SAY} (?:only |just |exactly |simply |back )?(?:with )?(?:the )?(?:word|phrase"
        rf"|string|sentence|sequence|following)\b"
        rf"|\b{_SAY} (?:(?:only|just|exactly|simply|back) (?:with )?|with |by saying )[\"“‘«]"
        r"|\b(?:just|only|simply) (?:print|say|output|type|reply|respond|write|repeat)\b"
        r"|\brepeat\b[^.\n]{0,80}\b\d+ times\b|\b(?:each|every) (?:single )?(?:reply|response"
        r"|answer|output)\b|\brefer to (?:me|yourself) as\b|\bmy (?:first|next) (?:question"
        r"|prompt|request|query|command|input)\b|\bcan you (?:please )?(?:write|tell|give"
        r"|provide|generate|explain|list|describe|create|show)\b"
        r"|\b(?:include|insert|add|append|embed|put|place|paste|render|display) (?:this"
        r"|the following"
        r"|these) (?:\w+ )?(?:string|text|message|link|url|image|anchor|markdown|html|code"
        r"|snippet|line|sentence|words?|payload)\b",
        "tells the reader of the answer what to do",
    ),
    (
        r"\b(?:new|updated|important|additional|hidden|secret|urgent|real|true|actual|revised"
        r"|priority) (?:\w+ )?(?:instructions?|directives?|task|orders|commands|objective"
        r"|mission)\b"
        r"|\byour (?:new |real |actual |true |only )?(?:task|goal|objective|mission|job|purpose)"
        r" (?:is|now is|will be)\b"
        r"|\b(?:do not|don't|dont|never) (?:tell|inform|mention|reveal|disclose) (?:this to )?"
        r"(?:the user|the human|the operator|anyone|the controller)\b"
        r"|\bwithout (?:telling|informing|asking|notifying|alerting)\b"
        r"|\bshould you accept it\b|\bfor (?:testing|academic|debugging|educational) purposes\b"
        r"|\blet'?s play a game\b|(?:^|[.!?]\s)as \w+, (?:you|do not|don't|never|always)\b",
        "smuggles instructions",
    ),
    (
        r"\b(?:execute|run|call|invoke)\s+(?:the\s+|this\s+)?(?:following|this|these)\s+"
        r"(?:command|code|script|tool|function)s?\b"
        r"|\b(?:send|forward|email|post|upload|reveal|leak)\s+(?:the\s+|all\s+|your\s+)?"
        r"(?:credentials|passwords?|secrets?|api\s+keys?|private\s+keys?)\b"
        r"|\b(?:grant|give)(?: me| us| yourself)? (?:temporary |full |admin(?:istrative)? |root )?"
        r"(?:access|privileges|permissions|admin)\b"
        r"|\b(?:enable|activate|unlock|turn on)(?: the)? (?:developer|debug|god|admin|unrestricted"
        r"|jailbreak|experimental|hidden|dan|sudo) (?:mode|features?|functionalit(?:y|ies)|access)"
        r"\b|\bmode\W{0,3}(?:enabled|activated|unlocked|on)\b"
        r"|\b(?:enable|activate|unlock)(?: the)? (?:\w+ ){0,4}mode\b",
        "asks for an action",
    ),
    (
        # The commonest injection phrases in other languages (a few words each); one leading
        # word boundary for them all keeps the search to the starts of words.
        r"\b(?:(?:ignora[rd]?|olvida) (?:\w+ ){0,3}instrucciones|a partir de ahora|ahora eres"
        r"|tu respuesta|nuevas instrucciones|instrucciones (?:anteriores|previas)"
        r"|(?:ignore[rz]?|oublie[rz]?) (?:\w+ ){0,3}instructions|à partir de maintenant"
        r"|(?:tu es|vous êtes) maintenant|(?:ta|votre) réponse|nouvelles instructions"
        r"|instructions (?:précédentes|antérieures)"
        r"|(?:ignorier\w{0,4}|vergiss) (?:\w+ ){0,3}(?:anweisungen|instruktionen|alles)"
        r"|ab (?:jetzt|sofort) (?:bist|sollst|wirst)|du bist (?:jetzt|nun)"
        r"|(?:deine|ihre) antwort|neue anweisungen|vorherigen anweisungen"
        r"|(?:ignore|esqueça|esqueca) (?:\w+ ){0,3}instruções|a partir de agora"
        r"|agora você é|(?:sua|tua) resposta|novas instruções|instruções anteriores"
        r"|(?:ignora|dimentica) (?:\w+ ){0,3}istruzioni|d'ora in poi|da ora in poi"
        r"|la tua risposta|nuove istruzioni|istruzioni precedenti"
        r"|(?:negeer|vergeet) (?:\w+ ){0,3}instructies|vanaf nu|je bent nu"
        r"|(?:je|jouw) antwoord|nieuwe instructies"
        r"|zignoruj|od teraz jesteś|twoja odpowiedź|nowe instrukcje"
        r"|talimatları (?:yok say|görmezden gel)|yeni talimatlar"
        r"|abaikan (?:\w+ ){0,2}instruksi|instruksi baru"
        r"|udhëzime të reja|përgjigj\w{0,4} (?:tënde|tuaj)"
        r"|treoracha nua|do fhreagra|stiùireadh ùr|(?:do|nad) fhreagairt"
        r"|imiyalelo emisha|\w{0,6}mpendul\w{0,6} yakho|ekuphenduleni kwakho"
        r"|du (?:solltest|sollst|musst|wirst)|deiner rolle|antworte als"
        r"|tu (?:vas|dois|devras|devrais)|réponds? (?:comme|en tant que)"
        r"|(?:tú|tu) (?:debes|vas a)|responde como|теперь ты|твой ответ)\b"
        r"|игнорируй|предыдущие инструкции|новые инструкции"
        r"|忽略(?:之前|以上|先前|所有|上述)|(?:新的|之前的|以上的)指令|你现在是|从现在开始"
        r"|指示を無視|以前の指示|新しい指示|今からあなたは",
        "an injection phrase in another language",
    ),
)
"""Language addressed to an AI or shaped like a prompt."""

_TLD = (
    r"(?:com|net|org|io|ai|app|dev|xyz|info|biz|top|site|online|link|click|zip|mov"
    r"|ru|cn|tk|me|co|ly|gg)"
)
URL: Final = _rules(
    (r"\b[a-z][a-z0-9+.-]{1,15}://", "contains a URL with a scheme"),
    (
        r"\b(?:javascript|vbscript):|\bdata:[a-z]+/[a-z0-9.+-]+[;,]|\bfile:/",
        "contains a script, data or file URI",
    ),
    (r"(?<![\w@.-])www\d?\.[a-z0-9-]+\.", "contains a www host"),
    (r"(?<![\w@.-])(?:[a-z0-9-]+\.)+[a-z]{2,}(?::[0-9]+)?/\S", "contains a host and path"),
    (rf"(?<![\w@.-])(?:[a-z0-9-]+\.)+{_TLD}\b", "contains a domain name"),
)
"""Pointers: an answer that links out can carry anything."""

CODE: Final = _rules(
    (r"```|~~~", "contains a code fence"),
    (r"`[^`\n]{1,500}`", "contains inline code"),
    (r"\bdef\s+\w+\s*\(", "contains a Python definition"),
    (
        r"\bfunction\(|\bfunction\s*\w*\s*\([^)]{0,200}\)\s*\{|=>\s*\{|\b(?:var|const"
        r"|let)\s+\w+\s*="
        r"|\b(?:alert|confirm|prompt)\s*\(|\bconsole\.\w+\s*\(|\bdocument\.[a-z]{3,}"
        r"|\bwindow\.(?:location|open)\b",
        "contains JavaScript",
    ),
    (
        r"<\s*script|\beval\s*\(\s*[^)\s]|\bexec\s*\(\s*[^)\s]|__import__\s*\(|\.__(?:class"
        r"|subclasses|globals|builtins|mro|getattribute|reduce|dict)__|\bsubprocess\.\w"
        r"|\bos\.(?:system|popen|exec\w*)\s*\(\s*[^)\s]|\bopen\s*\(\s*[\"']|\bshell\s*=\s*true\b"
        r"|\.communicate\s*\(|\bsystem\s*\(\s*[\"']|@\{\[|\$\{\s*[\w.()'\"]{1,100}\}"
        r"|\{\{\s*[\w.()'\"]{1,100}\s*\}\}",
        "contains code execution",
    ),
    (
        r"\bfrom\s+[\w.]+\s+import\s+\w|\bimport\s+(?:os|sys|subprocess|socket|requests)\b",
        "contains an import",
    ),
    (
        r"\$\(|\brm\s+-[rf]|\bcurl\s+(?:-|https?:)|\b(?:wget|sudo|chmod|chown|powershell)\s+\S"
        r"|\bnc\s+-[el]|\|\s*(?:ba|z)?sh\b|\b(?:ba|z)?sh\s+-[ci]\b|&&|\b2>&1|>\s*/dev/"
        r"|(?<![\w.])/(?:bin|etc|dev|tmp|proc)/\w|\b(?:mkfifo|netcat|ncat)\b"
        r"|\b(?:ls|cat|rm|touch|chmod|id|whoami|uname|ping)\s+-\w|;\s*(?:ls|cat|rm|id|whoami"
        r"|uname|wget|curl|nc|bash|sh)(?:\s+[-/~$.]|\s*$|\s*[;|&])",
        "contains shell syntax",
    ),
    (
        r"\b(?:drop\s+table|union\s+(?:all\s+)?select|select\s+\*\s+from|insert\s+into)\b"
        r"|'\s*(?:or|and)\s+[\w'\"]{1,20}\s*=\s*[\w'\"]{1,20}|;\s*--(?:\s|$)|'\s*--|@@[a-z]\w*"
        r"|\bselect\s+(?:case|count\(|distinct\s|@@)"
        r"|\bcase\s+when\b[^\n]{0,100}\bthen\b[^\n]{0,100}\b(?:else|end)\b"
        r"|\b(?:sleep|benchmark|pg_sleep)\s*\(\s*\d|\bwaitfor\s+delay\b"
        r"|'\s*;\s*(?:shutdown|drop|insert|delete|update|select|exec)\b",
        "contains SQL",
    ),
    (
        r"\{\s*\"[^\"\n]{1,40}\"\s*:|\"(?:role|content|function|tool|arguments|parameters)\"\s*:"
        r"|\b(?:function_call|tool_calls?|tool_use)\b"
        r"|<\s*/?\s*(?:tool_call|function_call|function|invoke|tool)\b"
        r"|\b[a-z_][\w.]{1,40}\(\s*[a-z_]\w{0,30}\s*=\s*[\"'\w]",
        "contains JSON or a tool call",
    ),
)
"""Executable syntax: code, shell, SQL, JSON and tool calls."""

MARKUP: Final = _rules(
    (
        r"</?[a-z][a-z0-9-]{0,30}(?:[\s/][^<>]{0,500})?/?>|<!--|<!\[cdata\["
        r"|\bon(?:error|load|click|mouseover|focus|blur|submit|change|input|keydown|keyup"
        r"|pageshow|toggle|begin|animationstart)\s*=",
        "contains an HTML or XML tag",
    ),
    (r"&(?:[a-z][a-z0-9]{1,30}|#[0-9]{1,7}|#x[0-9a-f]{1,6});", "contains a character entity"),
    (
        r"!?\[[^\]]{0,200}\]\([^)]{0,500}\)|!\[[^\]]{0,200}\]|^\[[^\]]{1,200}\]:",
        "contains a Markdown link or image",
    ),
)
"""Markup that renders: tags, entities, Markdown links and images."""
