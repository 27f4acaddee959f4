"""A seeded synthetic conversational-memory set: long multi-session chats between three
friends, with the questions people ask an assistant about them and the turns that answer.

Built against the ways retrieval fails on conversational memory:
- paraphrase: a question shares few words with its evidence ("What's Tom's current job?"
  against "Handed in my notice. Starting at Crestline Bank as an accountant in two weeks");
- near misses: distractor turns share surface words with the evidence or the question
  (another person's job, a city someone only visited, a pet that belongs to a neighbour);
- change over time: jobs, homes and hobbies change; "current" questions want the latest
  statement, whose older versions (and "I still miss ...") stay in the conversation;
- temporal order: "where did Maria live before moving to Porto?" names the newer state
  and wants the older one;
- several speakers, and facts about third parties told by a speaker;
- several evidence turns for list questions ("which places has Tom been to?").

Deterministic: one `random.Random` per conversation, seeded from (seed, index), so the first
conversations of a larger run are the same as those of a smaller one. English only,
template-based, three speakers per conversation; see docs/benchmarks.md for the limits.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any


@dataclass(frozen=True)
class Turn:
    turn_id: str
    speaker: str
    text: str
    at: datetime  # when it was said: the record's valid_from
    session: int
    # entities the turn declares (type, name): content.entities of its record
    entities: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Question:
    question_id: str
    conversation_id: str
    text: str
    evidence: tuple[str, ...]  # turn ids
    # fact, current, before, list, third_party, multi_hop, temporal, temporal_held
    kind: str


@dataclass(frozen=True)
class Conversation:
    conversation_id: str
    speakers: tuple[str, ...]
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Dataset:
    seed: int
    conversations: tuple[Conversation, ...]
    questions: tuple[Question, ...]


# --------------------------------------------------------------------------- vocabulary

WOMEN = [
    "Maria",
    "Priya",
    "Aisha",
    "Sofia",
    "Fatima",
    "Elena",
    "Chloe",
    "Hannah",
    "Grace",
    "Leila",
    "Yuki",
    "Nadia",
    "Zara",
    "Ines",
    "Julia",
    "Amara",
    "Rosa",
    "Mei",
    "Clara",
    "Lucy",
    "Freya",
    "Alma",
    "Noor",
    "Tessa",
    "Lina",
    "Ruth",
    "Vera",
    "Ada",
    "Keiko",
    "Marta",
]
MEN = [
    "Tom",
    "Daniel",
    "Lukas",
    "Kenji",
    "Oliver",
    "Marcus",
    "Diego",
    "Ravi",
    "Mateo",
    "Noah",
    "Samuel",
    "Ethan",
    "Gabriel",
    "Omar",
    "Felix",
    "Jonas",
    "Victor",
    "Adrian",
    "Tariq",
    "Hugo",
    "Emil",
    "Rafael",
    "Idris",
    "Bruno",
    "Theo",
    "Kofi",
    "Arjun",
    "Leon",
    "Pavel",
    "Sean",
]
JOBS = """nurse|paramedic|software engineer|high school teacher|accountant|graphic designer|
line cook|electrician|pharmacist|architect|data analyst|physiotherapist|journalist|lawyer|
dental hygienist|project manager|veterinary technician|barista|flight attendant|social worker|
librarian|marketing coordinator|carpenter|translator|real estate agent|lab technician|
bus driver|payroll specialist|UX researcher|sous chef""".replace("\n", "").split("|")
COMPANIES = """Northwind Health|Bluefin Labs|Harbor Street Bistro|Crestline Bank|Maple Ridge High|
Orbit Logistics|Pinewood Clinic|Silverline Media|Ironbridge Construction|Lumen Studio|
Cedar Valley Pharmacy|Atlas Insurance|Riverside Animal Hospital|Summit Air|Greenleaf Foods|
Quarry Law Group|Beacon Library|Tidewater Consulting|Nimbus Software|Redwood Realty|
Copperline Transit|Juniper Analytics|Saltmarsh Brewing|Kestrel Robotics|Hollow Oak Hotel""".replace(
    "\n", ""
).split("|")
CITIES = """Lisbon|Denver|Montreal|Austin|Melbourne|Edinburgh|Seattle|Barcelona|Toronto|Portland|
Vienna|Dublin|Osaka|Chicago|Copenhagen|Auckland|Boston|Prague|Vancouver|Nashville|Munich|
Cape Town|Minneapolis|Porto|Glasgow|Valencia|Leeds|Tucson|Halifax|Bristol""".replace(
    "\n", ""
).split("|")
PLACES = [
    ("Kyoto", "the bamboo forest"), ("Iceland", "the glacier lagoon"),
    ("Peru", "Machu Picchu"), ("Morocco", "the souks in Marrakech"), ("Norway", "the fjords"),
    ("Vietnam", "Ha Long Bay"), ("Greece", "the cliffs on Santorini"),
    ("Mexico City", "the pyramids at Teotihuacan"), ("Scotland", "the Highlands"),
    ("Costa Rica", "the cloud forest"), ("Croatia", "the old walls of Dubrovnik"),
    ("Banff", "Lake Louise"), ("Istanbul", "the Grand Bazaar"),
    ("New Orleans", "the jazz bars on Frenchmen Street"), ("Sicily", "Mount Etna"),
    ("Patagonia", "the Perito Moreno glacier"), ("Jordan", "Petra"),
    ("Sri Lanka", "the tea hills around Ella"), ("Tuscany", "the vineyards"),
    ("Bali", "the rice terraces"),
]  # fmt: skip
PETS = [
    ("beagle", "dog"), ("golden retriever", "dog"), ("corgi", "dog"), ("husky", "dog"),
    ("dachshund", "dog"), ("border collie", "dog"), ("tabby", "cat"), ("Siamese", "cat"),
    ("Maine Coon", "cat"), ("ragdoll", "cat"), ("lop-eared rabbit", "rabbit"),
    ("cockatiel", "bird"), ("budgie", "bird"),
]  # fmt: skip
KIND_WORDS = {
    "dog": ["dog", "pup", "puppy"], "cat": ["cat", "kitten", "kitty"],
    "rabbit": ["rabbit", "bunny"], "bird": ["bird", "birdie"],
}  # fmt: skip
PET_NAMES = [
    "Biscuit",
    "Pepper",
    "Luna",
    "Mochi",
    "Ziggy",
    "Waffles",
    "Olive",
    "Pickles",
    "Nugget",
    "Juniper",
    "Clementine",
    "Rocket",
    "Pretzel",
    "Maple",
    "Noodle",
    "Bean",
    "Pumpkin",
    "Tofu",
    "Socks",
    "Marble",
]
HOBBIES = """rock climbing|pottery|salsa dancing|trail running|chess|woodworking|birdwatching|
sourdough baking|watercolor painting|surfing|knitting|the cello|kayaking|film photography|
gardening|jiu-jitsu|archery|board game design|swing dancing|open water swimming""".replace(
    "\n", ""
).split("|")
FIELDS = """veterinary medicine|marine biology|architecture|nursing|law|computer science|
classical piano|journalism|physical therapy|urban planning|dentistry|fashion design""".replace(
    "\n", ""
).split("|")
SHOPS = ["bakery", "bike repair shop", "tattoo studio", "bookshop", "coffee cart", "yoga studio"]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
SHOWS = ["The Bear", "Severance", "Shogun", "Slow Horses", "Bake Off", "Succession", "Arcane"]
FOODS = ["ramen", "tacos", "lasagna", "pho", "curry", "pizza", "dumplings", "paella"]
TEAMS = ["the Rangers", "United", "the Hawks", "City", "the Bulls", "the Sharks"]
BOOKS = ["Project Hail Mary", "Circe", "Dune", "The Overstory", "Piranesi", "Educated"]

F = dict[str, str]
Line = tuple[str, str, str | None]  # speaker, text, evidence key

SMALL_TALK = [
    "Did you watch the new episode of {show}?", "I'm obsessed with {show} right now.",
    "It's been raining all week, ugh.", "Had the best {food} for dinner last night.",
    "Traffic this morning was a nightmare.", "I need so much more coffee today.",
    "Work has been super busy this week.", "Any plans for the weekend?",
    "Not much, just staying in and relaxing.", "My phone screen cracked again.",
    "Did you catch the game? {team} lost again.", "Trying to read more, currently on {book}.",
    "The heating in my building broke again.", "I slept terribly last night.",
    "Grocery prices are out of control.", "Finally cleaned out my closet, so satisfying.",
    "We should grab lunch sometime soon.", "I'm so tired of meetings.",
    "Made {food} from scratch, it turned out okay.", "It's so hot today I can't think.",
    "My laptop keeps freezing on me.", "How was your weekend?",
    "Pretty good, kind of uneventful.", "Ugh, Mondays.",
    "My mom called to ask about the holidays again.", "Started a podcast about old mysteries.",
    "Can't believe it's already {month}.", "Did you end up going to that concert?",
    "Thinking about repainting the kitchen.", "The neighbors are having a party again.",
    "Got a parking ticket today, great.", "I really need a vacation.",
    "Have you tried that new {food} place downtown?", "My plants are all dying, I give up.",
    "Spent the whole evening doing laundry.", "I keep forgetting to call the dentist.",
    "The wifi at home has been awful lately.", "Watching {show} again from the start.",
    "My sister sent me the funniest meme.", "Do you have a good {food} recipe?",
    "I bought way too many snacks.", "Is it just me or is this week dragging?",
    "My car is making a weird noise again.", "Went for a long walk by the river.",
]  # fmt: skip
FILLERS = [
    "Haha same.", "Totally agree.", "Lol what.", "That's wild.", "Honestly same here.",
    "I know, right?", "Ha, fair enough.", "Oh no.", "Yeah, for sure.", "Ugh, tell me about it.",
    "Hmm, maybe.", "Right?!", "Sounds good to me.", "Wait, really?", "Classic.",
]  # fmt: skip
OPENERS = ["", "", "", "Anyway, ", "Oh, ", "Btw, ", "Honestly, ", "Random, but "]
REACTIONS = [
    "Congrats!! That's huge.", "Wait, really? Since when?", "Oh nice, how do you feel about it?",
    "That's amazing, {S}.", "Haha I love that.", "You deserve it, honestly.",
    "Oof, that sounds like a lot.", "Keep me posted!", "No way, tell me everything.",
    "Good for you!", "Wow, I did not see that coming.", "That's so exciting.",
    "Okay that's actually great news.", "Hah, of course you did.",
]  # fmt: skip
PREFIXES = ["", "", "", "", "", "Remind me, ", "Quick question: ", "Hey, ", "Can you check: "]

# Facts: statements ({job}, {company}, ...), questions ({S}, {Ss} = "Maria's", {they}, ...),
# and distractors spoken by the same person ("S") or someone else ("O").
JOB_FIRST = [
    "I've been working as {a_job} at {company} for about {n} years now.",
    "Work is fine, being {a_job} at {company} pays the bills.",
    "My job is okay, {company} treats its {job} staff pretty well.",
    "You know I'm {a_job}, right? {company} has me on weekends lately.",
    "Still at {company} as {a_job}, nothing new on that front.",
]
JOB_CHANGE = [
    "Big news: I accepted a job offer to be {a_job} at {company}!",
    "Handed in my notice at work. Starting at {company} as {a_job} in two weeks.",
    "{company} finally called back, they want me as their new {job}.",
    "So I switched careers, I'm {a_job} now, over at {company}.",
    "First day at {company} tomorrow, a bit nervous about being {a_job}.",
    "Signed the contract! {Job} at {company}, starting next month.",
    "New job, new me: I'm working as {a_job} for {company} now.",
]
JOB_NOW = [
    "What's {Ss} current job?", "What does {S} do for a living these days?",
    "What does {S} do for work now?", "What job does {S} have now?",
    "Who is {S} working for now?", "What kind of work is {S} doing at the moment?",
    "Where does {S} work these days?", "What's {Ss} occupation now?",
    "What is {S} employed as currently?",
]  # fmt: skip
JOB_BEFORE = [
    "What did {S} do before {they} became {a_job}?", "Where did {S} work before joining {company}?",
    "What was {Ss} job before the one at {company}?",
    "Before {S} started at {company}, what was {their} line of work?",
]  # fmt: skip
JOB_DISTRACT = [
    ("O", "My brother-in-law is {a_job} too and he complains about the hours constantly."),
    ("O", "Is {company} hiring? My neighbor is desperate for a job."),
    ("S", "I almost took a job at {other_company} years ago, glad I didn't."),
    ("S", "Some days I wonder if I should quit and become {a_other_job}."),
    ("O", "My cousin interviewed at {company} and said the office is gorgeous."),
]
JOB_TAIL = [
    "The new role pays a lot better.", "Career change at my age, who knew.",
    "It's a full-time position with proper benefits.", "My commute to the office is ten minutes.",
    "Being employed somewhere sane feels great.",
]  # fmt: skip
JOB_MISS = "Honestly I still miss the people at {company} sometimes."

HOME_FIRST = [
    "My apartment in {city} is tiny but I love the neighborhood.",
    "Been in {city} for ages, can't imagine leaving.",
    "I love living in {city}, the parks are so close.",
    "Grew up here in {city} and never really left.",
]
HOME_CHANGE = [
    "We're packing boxes, the move to {city} is happening in two weeks.",
    "Signed a lease on a place in {city}!",
    "Officially living in {city} now, I'm still finding my way around.",
    "I'm moving to {city}, found a flat I can actually afford.",
    "I'm relocating to {city} next month, it's official.",
    "The movers dropped everything off in {city} yesterday, total chaos.",
    "Decided to pack up and head to {city}, I need a fresh start.",
]
HOME_NOW = [
    "Where does {S} live now?", "Which city is {S} based in these days?",
    "Where did {S} say {theyre} moving?", "What city is {S} living in at the moment?",
    "Where's home for {S} these days?",
]  # fmt: skip
HOME_BEFORE = [
    "Where did {S} live before moving to {city}?",
    "Which city was {S} in before {their} move to {city}?",
    "Before relocating to {city}, where was {S} living?",
]
HOME_DISTRACT = [
    ("O", "I was in {city} for a wedding last year, gorgeous place."),
    ("O", "Rent in {city} is insane from what I hear."),
    ("S", "My landlord keeps hinting the rent is going up again."),
    ("S", "A friend keeps begging me to visit {other_city} but I never find the time."),
    ("O", "Thinking about moving closer to my parents eventually."),
]
HOME_TAIL = [
    "The new apartment has a balcony!", "Still unpacking boxes though.",
    "The neighborhood already feels like home.", "Living there is going to be so different.",
]  # fmt: skip
HOME_MISS = "I still miss my old street in {city} sometimes."

PET_SAY = [
    "We adopted a {breed} from the shelter and named {it} {pet}.",
    "Got a {breed} {word}! {pet} is the cutest thing ever.",
    "Meet {pet}! A {breed}, and {it_is} already chewed my shoes.",
    "Say hi to {pet}, the newest member of the household, a little {breed}.",
    "Finally caved and got a {breed}. {pet} sleeps on my bed every night.",
    "My roommate found a stray {breed} and now {pet} is officially mine.",
]
PET_TAIL = [
    "Being a pet owner is a whole new world.", "The animal shelter said we're a perfect match.",
    "Already spending a fortune on treats and toys.",
]  # fmt: skip
PET_ASK = [
    "What did {S} name {their} new {kind}?", "What's the name of {Ss} {kind}?",
    "What kind of {kind} did {S} get?", "What's {Ss} {kind} called?",
]  # fmt: skip
PETS_ASK = ["What pets does {S} have?", "Does {S} have any animals at home?"]
PET_DISTRACT = [
    ("O", "My neighbor's {breed} got out again this morning."),
    ("S", "I'm not sure I could handle a {other_kind} right now, too much work."),
    ("O", "Did you see that video of the {kind} that opens doors?"),
    ("O", "{other_pet} is such a cute name, my aunt has a {other_kind} called that."),
]

HOBBY_FIRST = [
    "I've been doing {hobby} most weekends, it keeps me sane.",
    "Did a lot of {hobby} this weekend, still my favorite thing.",
]
HOBBY_CHANGE = [
    "I've gotten really into {hobby} lately, I go three times a week.",
    "My new hobby is {hobby}, it's so much fun.",
    "Spending all my free time on {hobby} these days.",
    "Signed up for a {hobby} class on a whim and I'm hooked.",
    "Dropped {old_hobby} completely, it's all {hobby} now.",
    "Bought all the gear for {hobby}, no going back now.",
]
HOBBY_NOW = [
    "What does {S} do for fun these days?", "What's {Ss} newest hobby?",
    "What pastime has {S} picked up recently?", "How does {S} spend {their} free time now?",
]  # fmt: skip
HOBBY_TAIL = [
    "Best way to unwind after a long week.", "It's how I spend every free evening.",
    "I didn't expect to love a hobby this much.",
]  # fmt: skip
HOBBY_BEFORE = [
    "What was {S} into before {hobby}?",
    "Which hobby did {S} have before taking up {hobby}?",
]
HOBBY_DISTRACT = [
    ("O", "I tried {hobby} once and nearly broke my wrist."),
    ("O", "My coworker won't stop talking about {other_hobby}."),
    ("S", "Watched a {other_hobby} competition on TV last night, looked fun."),
]

TRIP_SAY = [
    "Just got back from {place}, {sight} was unreal.",
    "Our trip to {place} was perfect, {sight} at sunrise!",
    "Vacation photos from {place} coming soon, {sight} was the best part.",
    "Spent a week in {place} with {companion}, I'm still jet lagged.",
    "{Companion} and I finally did the {place} trip, we saw {sight}.",
    "Back home after ten days in {place}. {Companion} planned everything.",
    "Traveled to {place} with {companion}, {sight} blew my mind.",
]
TRIP_TAIL = [
    "Best vacation I've had in years.", "I need another holiday to recover from the trip.",
    "Traveling abroad always resets my brain.",
]  # fmt: skip
TRIP_WHO = ["Who did {S} travel to {place} with?", "Who went with {S} on the {place} trip?"]
TRIP_WHAT = ["What did {S} see in {place}?", "What was the highlight of {Ss} {place} trip?"]
TRIP_LAST = ["Where did {S} go on {their} last vacation?", "What was {Ss} most recent trip?"]
TRIPS_ASK = [
    "Which places has {S} traveled to?", "Where has {S} been on holiday?",
    "What trips has {S} taken?",
]  # fmt: skip
TRIP_DISTRACT = [
    ("O", "My parents are thinking about {place} in the fall."),
    ("S", "{other_place} is on my bucket list, someday."),
    ("O", "Saw a documentary about {sight}, looked incredible."),
    ("S", "My boss just flew to {other_place} for a conference, so jealous."),
]
COMPANIONS = ["my college roommate {N}", "my cousin {N}", "my partner {N}", "my coworker {N}"]

KIN = [
    ("study", "My {rel} {N} got into a {field} program in {city}, we're all so proud.",
     ["What is {Ss} {rel} studying?", "Where is {Ss} {rel} going to school?",
      "What did {S} say {N} got accepted into?"]),
    ("move", "My {rel} {N} is relocating to {city} for a new job, I'm gutted.",
     ["Where did {S} say {their} {rel} is moving?", "Which city is {N} moving to?"]),
    ("wed", "{N}, my {rel}, is getting married in {month}, in {city} of all places!",
     ["When is {Ss} {rel} getting married?", "Whose wedding is {S} going to in {city}?"]),
    ("shop", "My {rel} {N} just opened a {shop} downtown, go check it out.",
     ["What kind of business did {Ss} {rel} start?", "What did {N} open recently?"]),
]  # fmt: skip
KIN_DISTRACT = [
    ("S", "{N} called me for like two hours yesterday."),
    ("O", "My {rel} is also thinking about going back to school."),
    ("O", "How's your {rel} doing these days?"),
]
RELS = ["sister", "brother", "cousin", "best friend"]

DIETS = [
    "I gave up meat back in the spring and honestly don't miss it.",
    "Cut out all dairy, my stomach is so much happier.",
    "Doctor says I need to stay away from gluten, so no more bread for me.",
    "Going fully plant-based now, no eggs, no cheese, nothing.",
    "I quit sugar a month ago and the cravings are finally gone.",
]
DIET_ASK = [
    "Is there anything {S} doesn't eat anymore?", "What dietary change did {S} make?",
    "Does {S} follow any special diet?",
    "What should I avoid cooking if {S} comes over for dinner?",
]  # fmt: skip
DIET_DISTRACT = [
    ("O", "That new steakhouse by the station is really good."),
    ("S", "I made a huge pot of chili for the office potluck."),
    ("O", "I could never give up cheese, no way."),
]
ALLERGIES = [
    "Ended up in urgent care after a satay, turns out peanuts and I don't get along.",
    "My face swelled up after the shrimp, so apparently shellfish is off the menu forever.",
    "Got stung at the picnic and my arm blew up like a balloon, bees are my enemy now.",
    "The doctor confirmed it: penicillin gives me hives.",
    "I sneeze nonstop around cats, so visiting my aunt is torture.",
]
ALLERGY_ASK = [
    "What is {S} allergic to?", "Does {S} have any allergies?",
    "What does {S} have a bad reaction to?", "Is there something {S} is allergic to?",
]  # fmt: skip
ALLERGY_DISTRACT = [
    ("O", "Pollen season is brutal this year."),
    ("S", "Took my dad to the ER last week, he's fine now."),
    ("O", "I had shrimp tacos for lunch, so good."),
]
RACES = [
    "Signed up for the {city} marathon in {month}, training starts now.",
    "Registered for a triathlon in {month}, and I can barely swim lol.",
    "I'm doing a 100 km charity bike ride in {month}, somebody stop me.",
    "My running club talked me into a half marathon in {month}.",
]
RACE_ASK = [
    "What event is {S} training for?", "What competition did {S} register for?",
    "What is {S} getting in shape for?",
]  # fmt: skip
RACE_DISTRACT = [
    ("O", "My brother ran a marathon years ago and still talks about it."),
    ("S", "My knees hurt just from climbing the stairs at work."),
    ("O", "The new bike lanes downtown are finally finished."),
]


# --------------------------------------------------------------------------- building


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _lower_first(s: str) -> str:
    """ "Did you ..." -> "did you ..."; "I ..." keeps its capital."""
    first = s.split(" ", 1)[0]
    return s if first == "I" or first.startswith("I'") else s[:1].lower() + s[1:]


def _a(word: str) -> str:
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


class _Chat:
    """One conversation being built: blocks of lines at positions in [0, 1) of its time."""

    def __init__(self, rng: random.Random, cid: str, speakers: Sequence[tuple[str, str]]):
        self.rng, self.cid = rng, cid
        self.speakers = list(speakers)  # (name, "f" | "m")
        self.blocks: list[tuple[float, int, list[Line]]] = []
        self.asks: list[tuple[str, tuple[str, ...], str]] = []  # text, evidence keys, kind
        self.keys = 0
        self.entities: dict[str, tuple[tuple[str, str], ...]] = {}  # key -> declared entities
        # successive states of a person's job or home: (topic, person, keys in order), the
        # ground of the temporal questions (asked once the turns have their times)
        self.states: list[tuple[str, F, list[str]]] = []

    def other(self, name: str) -> str:
        return self.rng.choice([n for n, _ in self.speakers if n != name])

    def at(self, pos: float, lines: list[Line]) -> None:
        self.blocks.append((pos, len(self.blocks), lines))

    def say(self, pos: float, who: str, text: str, tail: Sequence[str] = ()) -> str:
        """A statement that is evidence (half the time with a second sentence on the same
        topic, in other words), followed by a friend's reaction."""
        self.keys += 1
        key = f"k{self.keys}"
        if tail and self.rng.random() < 0.5:
            text = f"{text} {self.rng.choice(tail)}"
        lines: list[Line] = [(who, text, key)]
        lines.append((self.other(who), self.rng.choice(REACTIONS).format(S=who), None))
        self.at(pos, lines)
        return key

    def distract(self, who: str, choices: Sequence[tuple[str, str]], f: F, n: int = 1) -> None:
        for side, template in self.rng.sample(list(choices), min(n, len(choices))):
            speaker = who if side == "S" else self.other(who)
            self.at(self.rng.random(), [(speaker, template.format(**f), None)])

    def ask(
        self, templates: Sequence[str], f: F, keys: Sequence[str], kind: str, n: int = 1
    ) -> None:
        """n differently worded questions with the same evidence."""
        for template in self.rng.sample(list(templates), n):
            text, prefix = template.format(**f), self.rng.choice(PREFIXES)
            if prefix:
                text = prefix + _lower_first(text)
            if self.rng.random() < 0.12:  # typed casually
                text = text.rstrip("?").lower()
            self.asks.append((text, tuple(keys), kind))


# Multi-hop questions: the answer needs two records linked only by an entity (a person's
# employer's city; a decision's author's team). The linking turns declare their entities,
# as a formation model (or the speaker's app) would; the question names neither the
# entity between them nor the second record's words.
WORK_TEAMS = ["payments", "platform", "design", "growth", "data", "security", "mobile"]
DECISIONS = ["hiring freeze", "office move", "price increase", "app rewrite", "rebrand",
             "four-day week", "vendor switch"]  # fmt: skip
HOP_EMPLOYER = [
    ("My friend {N} just started working at {company}.",
     "{company} moved its whole office to {city} last year.",
     ["Which city is {N}'s employer in?", "Where is the company {N} works for based?"]),
    ("{N} took a job at {company} in the spring.",
     "I heard {company} is headquartered in {city}.",
     ["In what city is {N}'s new employer located?", "Which city is {N}'s company based in?"]),
]  # fmt: skip
HOP_DECISION = [
    ("It was {N} who pushed the {decision} through.",
     "{N} runs the {team} team these days.",
     ["Which team does the person behind the {decision} run?",
      "What team is led by whoever pushed the {decision} through?"]),
    ("The {decision} was {N}'s call in the end.",
     "{N} is in charge of the {team} team now.",
     ["Which team is run by the person who made the call on the {decision}?"]),
]  # fmt: skip


def _multi_hop(c: _Chat, rng: random.Random, names: list[str], chains: int = 4) -> None:
    """`chains` two-record chains, half employer -> city, half decision -> author -> team,
    said by different speakers at different times, each with its question."""
    companies, cities = rng.sample(COMPANIES, chains), rng.sample(CITIES, chains)
    decisions, teams = rng.sample(DECISIONS, chains), rng.sample(WORK_TEAMS, chains)
    for k in range(chains):
        n = names.pop()
        first_speaker, second_speaker = rng.sample([s for s, _ in c.speakers], 2)
        if k % 2 == 0:
            first, second, asks = rng.choice(HOP_EMPLOYER)
            f = {"N": n, "company": companies[k], "city": cities[k]}
            ents = ((("person", n), ("organization", companies[k])),
                    (("organization", companies[k]), ("location", cities[k])))  # fmt: skip
        else:
            first, second, asks = rng.choice(HOP_DECISION)
            f = {"N": n, "decision": decisions[k], "team": teams[k]}
            ents = ((("event", decisions[k]), ("person", n)),
                    (("person", n), ("organization", f"{teams[k]} team")))  # fmt: skip
        keys = []
        for pos, who, text, declared in (
            (rng.uniform(0.05, 0.5), first_speaker, first, ents[0]),
            (rng.uniform(0.5, 0.95), second_speaker, second, ents[1]),
        ):
            c.keys += 1
            key = f"k{c.keys}"
            c.entities[key] = declared
            c.at(pos, [(who, text.format(**f), key)])
            keys.append(key)
        text = rng.choice(asks).format(**f)
        c.asks.append((text, tuple(keys), "multi_hop"))


def _person(name: str, sex: str) -> F:
    f = {"they": "she", "their": "her", "theyre": "she's"} if sex == "f" else {}
    f = f or {"they": "he", "their": "his", "theyre": "he's"}
    return {"S": name, "Ss": f"{name}'s", **f}


def _states(rng: random.Random, n: int) -> list[float]:
    """Positions of n successive states: the first early, the others later, in order."""
    return [rng.uniform(0.0, 0.12), *sorted(rng.uniform(0.18, 0.97) for _ in range(n - 1))]


def _job(c: _Chat, p: F) -> None:
    rng, s = c.rng, p["S"]
    n = rng.choice([2, 2, 3])
    jobs, companies = rng.sample(JOBS, n + 1), rng.sample(COMPANIES, n + 1)
    keys = []
    for k, pos in enumerate(_states(rng, n)):
        f = {**p, "job": jobs[k], "a_job": _a(jobs[k]), "company": companies[k]}
        f["Job"], f["n"] = _cap(jobs[k]), str(rng.randint(2, 9))
        keys.append(
            c.say(pos, s, rng.choice(JOB_FIRST if k == 0 else JOB_CHANGE).format(**f), JOB_TAIL)
        )
        f.update(a_other_job=_a(jobs[n]), other_company=companies[n])
        c.distract(s, JOB_DISTRACT, f, rng.choice([1, 2]))
    c.ask(JOB_NOW, p, keys[-1:], "current", 2)
    c.states.append(("job", p, keys))
    for k in range(1, n):
        if k == n - 1 or rng.random() < 0.5:
            f = {**p, "a_job": _a(jobs[k]), "company": companies[k]}
            c.ask(JOB_BEFORE, f, keys[k - 1 : k], "before")
    if rng.random() < 0.7:
        c.at(rng.uniform(0.975, 1.0), [(s, JOB_MISS.format(company=companies[n - 2]), None)])


def _home(c: _Chat, p: F) -> None:
    rng, s = c.rng, p["S"]
    n = rng.choice([2, 2, 3])
    cities, keys = rng.sample(CITIES, n + 1), []
    for k, pos in enumerate(_states(rng, n)):
        f = {**p, "city": cities[k], "other_city": cities[n]}
        keys.append(
            c.say(pos, s, rng.choice(HOME_FIRST if k == 0 else HOME_CHANGE).format(**f), HOME_TAIL)
        )
        c.distract(s, HOME_DISTRACT, f, 1)
    c.ask(HOME_NOW, p, keys[-1:], "current", 2)
    c.states.append(("home", p, keys))
    c.ask(HOME_BEFORE, {**p, "city": cities[n - 1]}, keys[n - 2 : n - 1], "before")
    if rng.random() < 0.6:
        c.at(rng.uniform(0.975, 1.0), [(s, HOME_MISS.format(city=cities[n - 2]), None)])


def _pets(c: _Chat, p: F) -> None:
    rng, s = c.rng, p["S"]
    n = rng.choice([1, 1, 2])
    keys = []
    for (breed, kind), pet in zip(rng.sample(PETS, n), rng.sample(PET_NAMES, n), strict=True):
        it = rng.choice(["him", "her"])
        f = {**p, "breed": breed, "pet": pet, "it": it, "word": KIND_WORDS[kind][-1]}
        f["it_is"] = "he's" if it == "him" else "she's"
        keys.append(c.say(rng.uniform(0.05, 0.95), s, rng.choice(PET_SAY).format(**f), PET_TAIL))
        c.ask(PET_ASK, {**p, "kind": rng.choice(KIND_WORDS[kind])}, keys[-1:], "fact")
        others = [k for k in KIND_WORDS if k != kind]
        d = {
            **f,
            "kind": kind,
            "other_kind": rng.choice(others),
            "other_pet": rng.choice(PET_NAMES),
        }
        c.distract(s, PET_DISTRACT, d, rng.choice([1, 2]))
    if n > 1:
        c.ask(PETS_ASK, p, keys, "list")


def _hobby(c: _Chat, p: F) -> None:
    rng, s = c.rng, p["S"]
    hobbies = rng.sample(HOBBIES, 3)
    keys = []
    for k, pos in enumerate(_states(rng, 2)):
        f = {**p, "hobby": hobbies[k], "old_hobby": hobbies[0], "other_hobby": hobbies[2]}
        keys.append(
            c.say(
                pos, s, rng.choice(HOBBY_FIRST if k == 0 else HOBBY_CHANGE).format(**f), HOBBY_TAIL
            )
        )
        c.distract(s, HOBBY_DISTRACT, f, 1)
    c.ask(HOBBY_NOW, p, keys[-1:], "current")
    c.ask(HOBBY_BEFORE, {**p, "hobby": hobbies[1]}, keys[:1], "before")


def _trips(c: _Chat, p: F, names: list[str]) -> None:
    rng, s = c.rng, p["S"]
    n = rng.choice([2, 2, 3])
    places = rng.sample(PLACES, n + 1)
    keys, positions = [], sorted(rng.uniform(0.05, 0.95) for _ in range(n))
    for (place, sight), pos in zip(places[:n], positions, strict=True):
        companion = rng.choice(COMPANIONS).format(N=names.pop())
        f = {**p, "place": place, "sight": sight, "companion": companion}
        f["Companion"] = _cap(companion)
        template = rng.choice(TRIP_SAY)
        keys.append(c.say(pos, s, template.format(**f), TRIP_TAIL))
        asks = TRIP_WHO if "ompanion" in template else TRIP_WHAT
        c.ask(asks, f, keys[-1:], "fact")
        d = {**f, "other_place": places[n][0]}
        c.distract(s, TRIP_DISTRACT, d, 1)
    c.ask(TRIP_LAST, p, keys[-1:], "current")
    c.ask(TRIPS_ASK, p, keys, "list")


def _kin(c: _Chat, p: F, names: list[str]) -> None:
    rng, s = c.rng, p["S"]
    _, say, asks = rng.choice(KIN)
    f = {**p, "rel": rng.choice(RELS), "N": names.pop(), "city": rng.choice(CITIES)}
    f.update(field=rng.choice(FIELDS), month=rng.choice(MONTHS), shop=rng.choice(SHOPS))
    key = c.say(rng.uniform(0.05, 0.95), s, say.format(**f))
    c.ask(asks, f, [key], "third_party")
    c.distract(s, KIN_DISTRACT, f, 2)


def _single(c: _Chat, p: F, says: list[str], asks: list[str], distract: list[Any]) -> None:
    rng = c.rng
    f = {**p, "city": rng.choice(CITIES), "month": rng.choice(MONTHS)}
    key = c.say(rng.uniform(0.05, 0.95), p["S"], rng.choice(says).format(**f))
    c.ask(asks, p, [key], "fact")
    c.distract(p["S"], distract, f, 1)


def _small_talk(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return rng.choice(FILLERS)
    f = {"show": rng.choice(SHOWS), "food": rng.choice(FOODS), "team": rng.choice(TEAMS),
         "book": rng.choice(BOOKS), "month": rng.choice(MONTHS)}  # fmt: skip
    text = rng.choice(SMALL_TALK).format(**f)
    opener = rng.choice(OPENERS)
    return opener + _lower_first(text) if opener else text


def conversation(seed: int, index: int, turns: int = 300) -> tuple[Conversation, list[Question]]:
    rng = random.Random(f"memfabric-quality-{seed}-{index}")
    cid = f"conv-{index:02d}"
    women, men = rng.sample(WOMEN, 12), rng.sample(MEN, 12)
    sexes = rng.choice([["f", "m", "f"], ["m", "f", "m"], ["f", "f", "m"], ["m", "m", "f"]])
    speakers = [(women.pop() if x == "f" else men.pop(), x) for x in sexes]
    names = women + men  # third parties: never a speaker
    rng.shuffle(names)
    c = _Chat(rng, cid, speakers)
    for name, sex in speakers:
        p = _person(name, sex)
        _job(c, p)
        _home(c, p)
        _pets(c, p)
        _hobby(c, p)
        _trips(c, p, names)
        _kin(c, p, names)
        for says, asks, distract in rng.sample(
            [(DIETS, DIET_ASK, DIET_DISTRACT), (ALLERGIES, ALLERGY_ASK, ALLERGY_DISTRACT),
             (RACES, RACE_ASK, RACE_DISTRACT)], 2):  # fmt: skip
            _single(c, p, says, asks, distract)
    used = sum(len(lines) for _, _, lines in c.blocks)
    for _ in range(max(0, turns - used)):
        c.at(rng.random(), [(rng.choice(speakers)[0], _small_talk(rng), None)])
    # after everything else, with a generator of its own: the other turns and questions stay
    # as they were (only their ids and times move)
    _multi_hop(c, random.Random(f"memfabric-quality-{seed}-{index}-multi-hop"), names)
    lines = [line for _, _, block in sorted(c.blocks, key=lambda b: b[:2]) for line in block]
    # Sessions of 12-28 turns, days to weeks apart, evenings mostly; a turn a minute or two.
    when = datetime(2024, 1, 8, tzinfo=UTC) + timedelta(days=rng.randint(0, 200))
    out, by_key, session, left = [], {}, 0, 0
    for i, (speaker, text, key) in enumerate(lines):
        if left == 0:
            session, left = session + 1, rng.randint(12, 28)
            when += timedelta(days=rng.randint(2, 20))
            when = when.replace(hour=rng.randint(8, 21), minute=rng.randint(0, 59))
        when += timedelta(seconds=rng.randint(20, 150))
        left -= 1
        turn_id = f"{cid}-s{session:02d}-t{i:03d}"
        out.append(Turn(turn_id, speaker, text, when, session, c.entities.get(key or "", ())))
        if key:
            by_key[key] = turn_id
    # after the times are known, with a generator of their own (the rest stays as it was)
    _temporal(c, random.Random(f"memfabric-quality-{seed}-{index}-temporal"), out, by_key)
    questions = [
        Question(f"{cid}-q{n:03d}", cid, text, tuple(by_key[k] for k in keys), kind)
        for n, (text, keys, kind) in enumerate(c.asks)
    ]
    return Conversation(cid, tuple(n for n, _ in speakers), tuple(out)), questions


# Temporal questions: which of a person's successive jobs or homes they spoke of in a given
# month. Every state is said in the same words ("I started at ... as ..."), so only the time
# tells them apart. Their phrasings come in two halves: `temporal` is what the question
# parser (memfabric.timeparse) is developed on; `temporal_held` is held out, scored only
# for the temporal goal (docs/benchmarks.md), and was written before the parser.
TOPICS = {"job": ["work", "{their} job"], "home": ["where {they} lived", "{their} home"]}
TEMPORAL_DEV = [
    "What did {S} say about {topic} in {Month} {year}?",
    "In {Month} {year}, what was {Ss} news about {topic}?",
    "What was {S} telling us about {topic} back in {Month} {year}?",
    "What did {S} say about {topic} {ago}?",
]
TEMPORAL_HELD = [
    "During {Month} of {year}, what did {S} mention about {topic}?",
    "What did {S} share regarding {topic} around {Mon} {year}?",
    "{Ss} update on {topic} from {Month} {year}: what was it?",
    "Which news about {topic} did {S} give us {ago}?",
]
TEMPORAL_PER_STATE = 0.5  # the share of states asked about


def _ago(when: datetime, now: datetime) -> str | None:
    """The month of `when` said relative to `now` ("last month", "3 months ago"), when
    that names exactly that calendar month."""
    months = (now.year - when.year) * 12 + now.month - when.month
    if months == 1:
        return "last month"
    if 2 <= months <= 11:
        return f"{months} months ago"
    return None


def _temporal(c: _Chat, rng: random.Random, turns: list[Turn], by_key: dict[str, str]) -> None:
    """A temporal question for some states of each job and home: the month the state was
    said in, absolute ("in May 2024") or relative to the conversation's end ("3 months
    ago"); only when no other state of the same topic and person was said that month."""
    at = {t.turn_id: t.at for t in turns}
    now = turns[-1].at  # questions are asked after the conversation
    for topic, p, keys in c.states:
        months = [(at[by_key[k]].year, at[by_key[k]].month) for k in keys]
        for k, key in enumerate(keys):
            if months.count(months[k]) > 1 or rng.random() > TEMPORAL_PER_STATE:
                continue
            when = at[by_key[key]]
            held = rng.random() < 0.5
            templates = TEMPORAL_HELD if held else TEMPORAL_DEV
            template = rng.choice(templates)
            ago = _ago(when, now)
            if "{ago}" in template and ago is None:
                template = templates[0]
            f = {**p, "Month": when.strftime("%B"), "Mon": when.strftime("%b"),
                 "year": str(when.year), "ago": ago or ""}  # fmt: skip
            f["topic"] = rng.choice(TOPICS[topic]).format(**f)
            c.asks.append((template.format(**f), (key,), "temporal_held" if held else "temporal"))


def generate(
    seed: int = 7, conversations: int = 10, turns: int = 300, questions: int | None = None
) -> Dataset:
    """`conversations` chats of at least `turns` turns; all their questions, or a seeded
    sample of `questions` of them (in order)."""
    convs, asks = [], []
    for i in range(conversations):
        conv, qs = conversation(seed, i, turns)
        convs.append(conv)
        asks += qs
    if questions is not None and questions < len(asks):
        keep = sorted(
            random.Random(f"memfabric-quality-{seed}-q").sample(range(len(asks)), questions)
        )
        asks = [asks[i] for i in keep]
    return Dataset(seed, tuple(convs), tuple(asks))


if __name__ == "__main__":  # a look at the data: python tests/bench/quality/generate.py
    data = generate(conversations=1)
    conv = data.conversations[0]
    for t in conv.turns[:40]:
        print(f"{t.turn_id} {t.at:%Y-%m-%d %H:%M} {t.speaker}: {t.text}")
    by_id = {t.turn_id: t for t in conv.turns}
    for q in data.questions[:25]:
        print(f"\n[{q.kind}] {q.text}")
        for e in q.evidence:
            print(f"   -> {by_id[e].speaker}: {by_id[e].text}")
