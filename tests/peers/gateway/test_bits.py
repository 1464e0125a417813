import itertools
import math
import unicodedata
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import event, given, settings, strategies as st, target

from peers.gateway.bits import (
    BITS_PER_WORD,
    DATE_BITS,
    ENGLISH,
    NAMES,
    VOCABULARY,
    answer_bits,
    field_bits,
    foreign_char,
    question_bits,
    short_answer_allowance,
    spec_bits,
    spec_ceiling,
    text_bits,
    value_bits,
    vocabulary_rank,
    word_bits,
)
from peers.gateway.validation import MAX_WORD_CHARS, validate_response
from schemas.bcp import QuerySpec, Question, SpecField

# BCP §"Category 1: Structured Primitives", wire format example.
SEED_CAT1 = {
    "category": 1,
    "fields": [
        {"name": "is_urgent", "type": "boolean"},
        {"name": "sentiment", "type": "enum", "values": ["positive", "neutral", "negative"]},
        {"name": "confidence", "type": "integer", "min": 1, "max": 5},
        {"name": "category", "type": "enum", "values": ["billing", "technical", "legal", "other"]},
    ],
}

# BCP Subscriptions, the research-findings subscription.
SEED_CAT2 = {
    "category": 2,
    "questions": [
        {"id": "q1", "question": "Topic?", "max_words": 10, "expected_format": "short_text"},
        {"id": "q2", "question": "Finding?", "max_words": 50, "expected_format": "short_text"},
        {"id": "q3", "question": "Relevance?", "max_words": 1, "expected_format": "integer"},
    ],
}


def test_boolean_is_one_bit():
    """A boolean field costs exactly 1 bit."""
    assert field_bits(SpecField(name="b", type="boolean")) == 1.0


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 256])
def test_enum_is_log2_of_its_values(count):
    """An enum of N values costs log2(N) bits; a single value costs nothing."""
    field = SpecField(name="e", type="enum", values=tuple(f"v{i}" for i in range(count)))
    assert field_bits(field) == pytest.approx(math.log2(count))


@pytest.mark.parametrize(
    ("low", "high", "bits"),
    [(1, 5, math.log2(5)), (0, 1, 1.0), (7, 7, 0.0), (-128, 127, 8.0), (0, 2**32 - 1, 32.0)],
)
def test_integer_is_log2_of_its_range(low, high, bits):
    """An integer in [min, max] costs log2(max - min + 1) bits."""
    assert field_bits(SpecField(name="i", type="integer", min=low, max=high)) == bits


def test_seed_cat1_example_is_about_6_9_bits():
    """The BCP spec's Cat-1 example totals ~6.9 bits: 1 + log2(3) + log2(5) + 2."""
    bits = spec_bits(QuerySpec.model_validate(SEED_CAT1))
    assert bits == pytest.approx(1 + math.log2(3) + math.log2(5) + 2)
    assert round(bits, 3) == 6.907


def test_seed_cat2_subscription_is_exactly_671_bits():
    """A 10 + 50 + 1 word Cat-2 spec is exactly 671.0 bits, as the Subscriptions spec says."""
    assert spec_bits(QuerySpec.model_validate(SEED_CAT2)) == 671.0


def test_text_is_eleven_bits_per_word():
    """Text costs 11 bits per allowed word."""
    assert BITS_PER_WORD == 11
    assert text_bits(5) == 55.0
    question = Question(id="q", question="?", max_words=30, expected_format="short_list")
    assert question_bits(question) == 330.0


def test_cat3_summary_costs_its_word_limit():
    """A Cat-3 summary of 100 words costs 1,100 bits (BCP: "~1,100 bits")."""
    spec = QuerySpec(category=3, directive="Summarize.", max_words=100)
    assert spec_bits(spec) == 1100.0


def test_default_max_words_is_charged():
    """A Cat-2 spec's top-level max_words is charged for each question that omits its own."""
    spec = QuerySpec.model_validate(
        {
            "category": 2,
            "max_words": 4,
            "questions": [
                {"id": "a", "question": "?", "expected_format": "date"},
                {"id": "b", "question": "?", "expected_format": "date", "max_words": 2},
            ],
        }
    )
    assert spec_bits(spec) == 66.0


def test_same_as_question_is_charged_in_full():
    """A redundant same_as question costs its own words: the reader still writes it."""
    spec = QuerySpec.model_validate(
        {
            "category": 2,
            "questions": [
                {"id": "a", "question": "?", "max_words": 3, "expected_format": "person_name"},
                {
                    "id": "b",
                    "question": "?",
                    "max_words": 3,
                    "expected_format": "person_name",
                    "same_as": "a",
                },
            ],
        }
    )
    assert spec_bits(spec) == 66.0 + 44.0  # and the short-answer allowance, 6 words of text


@given(st.lists(st.integers(min_value=1, max_value=2000), min_size=1, max_size=32))
def test_cat2_cost_is_eleven_times_the_word_total_and_the_allowance(limits):
    """A Cat-2 spec costs 11 bits a word, plus 11 x min(4, 14 - words) while that is positive."""
    questions = [
        {"id": f"q{i}", "question": "?", "max_words": n, "expected_format": "short_text"}
        for i, n in enumerate(limits)
    ]
    spec = QuerySpec.model_validate({"category": 2, "questions": questions})
    words = sum(limits)
    assert spec_bits(spec) == float(11 * words + 11 * max(0, min(4, 14 - words)))


@pytest.mark.parametrize(
    ("words", "allowance"), [(1, 44.0), (10, 44.0), (11, 33.0), (13, 11.0), (14, 0.0), (60, 0.0)]
)
def test_the_short_answer_allowance_shrinks_and_the_charge_never_does(words, allowance):
    """The allowance is 4 words' worth up to 10 words, then shrinks; the charge never falls."""
    question = Question(id="q", question="?", max_words=words, expected_format="short_text")
    assert short_answer_allowance([question]) == allowance
    charges = [
        spec_bits(QuerySpec(category=2, questions=(question.model_copy(update={"max_words": n}),)))
        for n in range(1, 40)
    ]
    assert charges == sorted(charges)


def test_formats_with_exact_codes_get_no_allowance():
    """integer, number, date and yes_no answers are measured exactly: no allowance."""
    questions = [
        Question(id=f, question="?", max_words=1, expected_format=f)
        for f in ("integer", "number", "date", "yes_no")
    ]
    assert short_answer_allowance(questions) == 0.0


@given(st.integers(-(2**53) + 1, 2**53 - 1), st.integers(0, 2**40))
def test_integer_bits_grow_with_the_range(low, width):
    """An integer field's bits are log2 of its range size, so a wider range never costs less."""
    high = min(low + width, 2**53 - 1)
    narrow = field_bits(SpecField(name="i", type="integer", min=low, max=low))
    wide = field_bits(SpecField(name="i", type="integer", min=low, max=high))
    assert narrow == 0.0
    assert wide == pytest.approx(math.log2(high - low + 1))


# Ordinary short factual answers, written for these tests: one (topic | finding) push on the
# reference research-findings subscription a line, long ones continued on an indented line.
# Numbers, units, names and dates; no URLs.
BENIGN_FINDINGS = """
Intermittent fasting and insulin sensitivity | A 12-week trial of 120 adults found that
  time-restricted eating improved insulin sensitivity by 18% compared with controls.
Quantum error correction | Google reported a logical qubit whose error rate fell as the surface
  code grew from distance 3 to distance 7.
Battery recycling in Europe | The EU battery regulation requires 70% of lithium to be recovered
  from waste batteries by the end of 2030.
Coral bleaching on the Great Barrier Reef | Aerial surveys in March 2024 found bleaching on
  about 73% of the reefs that were inspected.
Measles cases in the United States | The CDC counted 1,274 measles cases in 2019, the highest
  number since 1992.
James Webb Space Telescope | The telescope launched on December 25, 2021 and reached its orbit
  around the second Lagrange point a month later.
Antibiotic resistance | A Lancet study estimated that bacterial antimicrobial resistance was
  directly responsible for 1.27 million deaths in 2019.
Global temperature record | Copernicus reported that 2023 was the warmest year on record, about
  1.48 °C above the pre-industrial average.
Python 3.12 release | Python 3.12 was released in October 2023 with better error messages and a
  per-interpreter GIL.
Semiconductor export controls | The United States restricted exports of advanced AI chips to
  China in October 2022 and tightened the rules a year later.
Sleep and memory | Participants who slept eight hours after learning recalled about 20% more
  word pairs than those kept awake.
Electric vehicle sales | Electric cars made up about 18% of new car sales worldwide in 2023, up
  from 14% in 2022.
Ozone layer recovery | A UN assessment expects the ozone layer to return to 1980 levels over
  most of the world by around 2040.
Malaria vaccine | The WHO recommended the R21/Matrix-M malaria vaccine for children in October
  2023.
Microplastics in drinking water | Researchers found an average of 240,000 plastic particles per
  liter in bottled water using a new imaging method.
Mars helicopter | NASA's Ingenuity helicopter made 72 flights on Mars before a damaged rotor
  ended its mission in January 2024.
Honeybee colony losses | Beekeepers in the United States lost an estimated 48% of their managed
  colonies between April 2022 and April 2023.
Remote work productivity | A randomized trial at a Chinese travel company found that hybrid work
  cut quit rates by a third without hurting performance.
Lead in spices | The FDA traced high lead levels in cinnamon applesauce pouches to a single
  supplier in Ecuador.
Deep sea mining | The International Seabed Authority has not yet adopted rules for commercial
  mining of the deep seabed.
Aspirin for primary prevention | Large trials found that daily low-dose aspirin did not reduce
  heart attacks in healthy older adults and raised bleeding risk.
Solar panel prices | The average price of solar modules fell below 20 cents per watt in late
  2023.
Voyager 1 communication | Engineers restored readable data from Voyager 1 in April 2024 after
  moving code away from a faulty memory chip.
Alzheimer's drug lecanemab | In its phase 3 trial, lecanemab slowed cognitive decline by 27%
  over 18 months compared with placebo.
Global population | The United Nations estimated that the world population reached 8 billion on
  November 15, 2022.
Drought in the Panama Canal | Low water in Gatun Lake forced the Panama Canal to cut daily
  transits from about 36 to 22 in late 2023.
Heat pumps | Heat pump sales in Europe fell by about 5% in 2023 after two years of strong
  growth.
Urban trees and heat | A study of 93 European cities estimated that raising tree cover to 30%
  could prevent a third of heat-related deaths.
Open source security | The xz backdoor was discovered in March 2024 by a Microsoft engineer who
  noticed slow SSH logins.
Rust in the Linux kernel | Linux 6.1 was the first kernel release to include initial support for
  drivers written in Rust.
Arctic sea ice | Arctic sea ice reached its annual minimum of 4.23 million square kilometers on
  September 19, 2023.
Sodium and blood pressure | Cutting salt intake by about one teaspoon a day lowered systolic
  blood pressure by 6 mmHg on average.
Wind power in the North Sea | The Dogger Bank wind farm delivered its first power to the UK grid
  in October 2023.
GLP-1 drugs and heart disease | In the SELECT trial, semaglutide reduced major cardiovascular
  events by 20% in adults with obesity.
Smartphone bans in schools | The Netherlands banned phones in most secondary school classrooms
  from January 2024.
Cholera outbreaks | The WHO reported cholera outbreaks in 30 countries in 2022, more than in any
  recent year.
Ancient DNA | Sequencing of teeth from a 4,500-year-old grave showed that the buried men were
  related through their fathers.
Fusion energy | The National Ignition Facility produced 3.15 megajoules of fusion energy from
  2.05 megajoules of laser light in December 2022.
Bird flu in cattle | H5N1 avian influenza was confirmed in dairy cattle in Texas and Kansas in
  March 2024.
Wildfires in Canada | Wildfires burned about 18.5 million hectares in Canada in 2023, the worst
  season on record.
Air pollution and dementia | Long-term exposure to fine particulate matter was linked to a
  higher risk of dementia in a review of 51 studies.
Minimum wage increases | California raised the minimum wage for fast food workers to $20 an hour
  in April 2024.
Lithium deposits | Geologists estimated that a caldera on the Nevada-Oregon border may hold up
  to 40 million tonnes of lithium.
Hubble Space Telescope | Hubble switched to a one-gyroscope mode in June 2024 to extend its
  working life.
Childhood myopia | Spending two more hours outdoors each day reduced the onset of
  nearsightedness in children in several trials.
Chess engines | Stockfish 16 was released in June 2023 and uses a neural network to evaluate
  positions.
Railway electrification | About 38% of the UK rail network is electrified, compared with over
  60% in Germany.
Food prices | The FAO food price index fell 13.7% in 2023 from its average in 2022.
Avian migration | A bar-tailed godwit flew 13,560 kilometers from Alaska to Tasmania without
  stopping in 2022.
Nuclear power in Japan | Japan restarted its twelfth nuclear reactor since the 2011 Fukushima
  accident in 2023.
Dengue fever in Brazil | Brazil recorded more than one million dengue cases in the first two
  months of 2024.
Large language model benchmarks | The MMLU benchmark covers 57 subjects, from elementary
  mathematics to law.
Plastic recycling rates | Only about 9% of plastic waste is recycled worldwide, according to the
  OECD.
Earthquake in Morocco | A magnitude 6.8 earthquake struck the High Atlas mountains on September
  8, 2023, killing nearly 3,000 people.
Gene therapy for sickle cell disease | Regulators in the UK approved Casgevy, the first
  CRISPR-based therapy, in November 2023.
Gut bacteria and mood | Mice given gut bacteria from depressed people showed more anxious
  behavior in several studies.
High-speed rail in Spain | Spain has the longest high-speed rail network in Europe, with more
  than 3,900 kilometers of track.
Password managers | LastPass disclosed in December 2022 that attackers had copied encrypted
  customer vaults.
Sea level rise | Global mean sea level rose about 10 centimeters between 1993 and 2023,
  according to satellite records.
Artificial sweeteners | The WHO advised against using non-sugar sweeteners for weight control in
  May 2023.
Wolves in Germany | Germany counted 184 wolf packs during the 2022 to 2023 monitoring year.
Exercise and depression | A meta-analysis of 218 trials found that walking, jogging and yoga
  reduced symptoms of depression.
Moon landing by India | India's Chandrayaan-3 landed near the lunar south pole on August 23,
  2023.
Desalination | Israel gets about 80% of its household water from five large desalination plants.
Vitamin D supplements | The VITAL trial found that vitamin D supplements did not prevent cancer
  or heart disease in healthy adults.
Bird strikes on aircraft | The FAA recorded more than 19,000 wildlife strikes on aircraft in the
  United States in 2023.
Coffee and longevity | Drinking two to three cups of coffee a day was associated with a lower
  risk of death in a study of 449,563 people.
Postal voting | About 43% of voters in the 2020 United States election cast their ballots by
  mail.
Tuberculosis | Tuberculosis caused an estimated 1.3 million deaths in 2022, according to the
  WHO.
Bridge collapse in Baltimore | The Francis Scott Key Bridge collapsed on March 26, 2024 after a
  container ship struck one of its piers.
Reading to children | Children whose parents read to them daily heard about 1.4 million more
  words by age five.
Neanderthal genes | People of European and Asian descent carry about 1% to 2% Neanderthal DNA.
Carbon capture | The Orca plant in Iceland was designed to capture up to 4,000 tonnes of carbon
  dioxide a year.
Hydrogen buses | Several European cities ended hydrogen bus trials because fuel costs were much
  higher than expected.
Screen time and toddlers | Toddlers with more screen time at age one had higher rates of
  communication delays at age two.
Glacier loss in the Alps | Swiss glaciers lost about 4% of their remaining volume in 2023 after
  losing 6% in 2022.
Fertility rates | South Korea's total fertility rate fell to 0.72 in 2023, the lowest in the
  world.
Spam calls | The FCC proposed a fine of $300 million against a network of companies behind auto
  warranty robocalls.
Printing press history | Johannes Gutenberg printed his Bible in Mainz around 1455.
Crop yields and heat | Maize yields in the United States drop sharply once daytime temperatures
  pass about 29 °C.
Blue whales | Blue whales can reach 30 meters in length and weigh up to 190 tonnes.
Language learning apps | Duolingo reported 88.6 million monthly active users at the end of 2023.
Vaccination rates | Global coverage with three doses of the DTP vaccine recovered to 84% in
  2022.
Ocean heat content | The upper 2,000 meters of the ocean absorbed a record amount of heat in
  2023.
Rabies | Rabies kills about 59,000 people each year, mostly in Asia and Africa.
Bicycle lanes in Paris | Paris built more than 1,000 kilometers of bicycle lanes and saw cycling
  double between 2022 and 2023.
Antarctic ice shelves | The Conger ice shelf in East Antarctica collapsed in March 2022 after a
  heat wave.
Invasive species costs | Invasive species cost the world economy at least $423 billion a year,
  according to an IPBES report.
Ultra-processed food | A review of 45 meta-analyses linked ultra-processed food to 32 health
  problems.
Insect decline | A German study recorded a 76% decline in flying insect biomass over 27 years.
Atomic clocks | An optical lattice clock at JILA would lose less than one second over 15 billion
  years.
Avalanche deaths | Switzerland records about 20 avalanche deaths in an average winter.
Data breaches | IBM estimated the average cost of a data breach at $4.45 million in 2023.
Rice and arsenic | Brown rice contains more arsenic than white rice because arsenic collects in
  the outer layers of the grain.
Chagas disease | Chagas disease affects an estimated 6 to 7 million people, mostly in Latin
  America.
Saturn's moons | Astronomers confirmed 62 new moons of Saturn in 2023, bringing its total to
  145.
Apprenticeships | Germany has about 1.2 million apprentices training in more than 320 recognized
  occupations.
Fish stocks | The FAO estimates that about 35% of the world's fish stocks are overfished.
Volcano in Iceland | The Sundhnúkur crater row near Grindavík erupted several times between
  December 2023 and 2024.
Typing speed | Professional typists average about 65 to 75 words per minute.
Mosquito control | Releasing mosquitoes infected with Wolbachia cut dengue cases by 77% in a
  trial in Yogyakarta.
Wind turbine recycling | Vestas announced a method to recycle epoxy-based turbine blades in
  February 2023.
Loneliness | The US Surgeon General described loneliness as a public health epidemic in May
  2023.
Lithium-ion battery fires | New York City recorded 268 fires caused by e-bike batteries in 2023.
Cybersecurity of hospitals | A ransomware attack on Change Healthcare in February 2024 delayed
  payments to pharmacies across the United States.
Renewable electricity | Renewables supplied about 30% of global electricity generation in 2023.
Seagrass meadows | Seagrass meadows store carbon up to 35 times faster than tropical rainforests
  per hectare.
Obesity rates | About 42% of adults in the United States had obesity in the 2017 to 2020 survey.
Elephant communication | Researchers found that African elephants appear to address each other
  with name-like calls.
Chip manufacturing | TSMC began volume production of 3-nanometer chips in December 2022.
Drowning | Drowning kills an estimated 236,000 people each year, according to the WHO.
Asteroid deflection | NASA's DART spacecraft shortened the orbit of the asteroid Dimorphos by 33
  minutes in 2022.
Tree planting | A study found that natural regrowth of forests often stores more carbon than
  planted trees.
Literacy rates | Global adult literacy reached about 87% in 2022.
Meteorite impacts | The Chicxulub crater in Mexico is about 180 kilometers wide.
Vertical farming | Several large vertical farming companies went bankrupt in 2023 because of
  high energy costs.
Ebola vaccine | The Ervebo vaccine was approved in the European Union in November 2019.
Teen mental health | The share of American teens reporting persistent sadness rose from 28% in
  2011 to 42% in 2021.
Fog harvesting | Fog nets in Morocco collect up to 6,300 liters of water on a foggy day.
Lyme disease | About 476,000 people are diagnosed and treated for Lyme disease in the United
  States each year.
Horse domestication | Genetic evidence points to the lower Volga-Don region as the origin of
  modern domestic horses about 4,200 years ago.
Online news subscriptions | The New York Times passed 10 million subscribers in 2023.
Traffic deaths | About 1.19 million people died in road crashes worldwide in 2021.
Shark attacks | There were 69 unprovoked shark bites worldwide in 2023.
Noise pollution | Long-term exposure to road traffic noise above 53 decibels is linked to higher
  blood pressure.
Urban heat islands | City centers can be up to 7 °C warmer than surrounding rural areas on
  summer nights.
Medieval manuscripts | The Voynich manuscript has been dated by radiocarbon to the early
  fifteenth century.
Steel production | China produced about 1.02 billion tonnes of crude steel in 2023, over half of
  world output.
Rare earth elements | China accounted for about 70% of rare earth mining in 2022.
Volunteer computing | The Folding@home project passed one exaflop of computing power in March
  2020.
Kidney transplants | Surgeons in Boston transplanted a genetically edited pig kidney into a
  living patient in March 2024.
Public libraries | Finland has about 730 public libraries for a population of 5.5 million.
Snow leopards | Scientists estimate there are between 4,000 and 6,500 snow leopards in the wild.
Typhoid | Extensively drug-resistant typhoid spread widely in Pakistan after 2016.
Peat bogs | Peatlands cover about 3% of the world's land but store more carbon than all forests
  combined.
Microfinance | Several large trials found that microcredit had modest effects on household
  income.
Coal power in India | Coal supplied about 74% of India's electricity in 2023.
Solar eclipse | A total solar eclipse crossed Mexico, the United States and Canada on April 8,
  2024.
Cheese making | Parmigiano Reggiano must be aged for at least 12 months.
Handwashing | Handwashing with soap reduced diarrheal illness by about 30% in a review of
  community trials.
Bats and viruses | Bats host more zoonotic viruses per species than rodents, according to a 2020
  analysis.
Fuel efficiency standards | The EPA finalized vehicle emission standards for model years 2027 to
  2032 in March 2024.
Green roofs | Green roofs can lower roof surface temperatures by up to 30 °C in summer.
Autism diagnosis | About 1 in 36 children in the United States was identified with autism in
  2020.
Mediterranean diet | The PREDIMED trial reported about 30% fewer cardiovascular events with a
  Mediterranean diet.
Underground water | Groundwater levels fell rapidly in 30% of the aquifers studied worldwide
  since 2000.
Lightning deaths | Lightning kills about 20 people a year in the United States.
Video game industry | The global video game market earned about $184 billion in 2023.
Artemis program | NASA delayed the Artemis II crewed lunar flyby to September 2025.
Breast milk research | Human milk contains more than 200 different sugar molecules called
  oligosaccharides.
Rubber trees | Thailand is the world's largest producer of natural rubber.
Wild salmon | Sockeye salmon returns to Bristol Bay in Alaska set records in 2022.
Telomeres | Telomeres shorten each time a cell divides.
Flood defenses | The Thames Barrier in London has closed more than 200 times since 1982.
Antarctic krill | Antarctic krill have an estimated total biomass of around 379 million tonnes.
Self-driving cars | Waymo began offering fully driverless rides to the public in San Francisco
  in 2023.
Nitrogen fertilizer | Nitrogen fertilizer use roughly doubled crop yields in many regions during
  the twentieth century.
Forest fires in Greece | The Evros wildfire of August 2023 was the largest recorded in the
  European Union.
Pneumonia in children | Pneumonia kills about 700,000 children under five every year.
Hearing loss | About 1.5 billion people live with some degree of hearing loss.
Ocean plastic cleanup | The Ocean Cleanup removed more than 100,000 kilograms of plastic from
  the Great Pacific Garbage Patch by 2023.
Ancient Rome | The Colosseum could hold between 50,000 and 80,000 spectators.
Clouds and climate | Low clouds over the oceans reflect sunlight and cool the planet.
Printer ink | Ink cartridges can cost more per milliliter than fine perfume.
Mountain gorillas | The number of mountain gorillas rose to more than 1,000 in the 2018 census.
Diabetes prevalence | About 537 million adults were living with diabetes in 2021.
Cloud seeding | The United Arab Emirates runs hundreds of cloud seeding flights each year.
Marathon records | Kelvin Kiptum ran the marathon in 2:00:35 in Chicago in October 2023.
Chimpanzee tool use | Chimpanzees in Guinea use stones to crack open nuts.
Tire particles | Tire wear is one of the largest sources of microplastics in the environment.
Indoor air quality | Gas stoves were linked to about 12.7% of childhood asthma cases in the
  United States.
Nobel Prize in Physics | The 2023 Nobel Prize in Physics went to Agostini, Krausz and L'Huillier
  for attosecond light pulses.
Nobel Prize in Medicine | Katalin Karikó and Drew Weissman won the 2023 Nobel Prize in Medicine
  for their work on mRNA.
World Cup attendance | The 1994 World Cup in the United States had an average attendance of
  about 68,991 per match.
Carbon dioxide levels | Atmospheric carbon dioxide at Mauna Loa peaked at about 424 parts per
  million in May 2023.
Octopus intelligence | Octopuses have about 500 million neurons, most of them in their arms.
Whale songs | Humpback whale songs change gradually and spread across ocean basins.
Citrus greening | Citrus greening disease cut Florida's orange harvest by more than 90% since
  2004.
Wastewater surveillance | Wastewater testing detected rising COVID-19 levels about a week before
  hospital admissions rose.
Glass frogs | Glass frogs hide red blood cells in their liver to become transparent while they
  sleep.
Internet access | About 2.6 billion people remained offline in 2023, according to the ITU.
Inflation in Argentina | Annual inflation in Argentina passed 211% in December 2023.
Brain implants | Neuralink implanted its first device in a human patient in January 2024.
Wheat prices | Wheat prices fell back below pre-war levels in 2023 after spiking in March 2022.
Tiger populations | India's tiger census counted at least 3,167 tigers in 2022.
Cave paintings | A painting of a pig in Sulawesi was dated to at least 45,500 years ago.
Sahara dust | Dust from the Sahara supplies phosphorus to the Amazon rainforest.
Noise-canceling headphones | Active noise cancellation works best on low, steady sounds such as
  engine hum.
Urban farming | Singapore aims to produce 30% of its nutritional needs locally by 2030.
Train punctuality | Swiss trains arrived within three minutes of schedule about 93% of the time
  in 2023.
Hurricane intensification | Hurricane Otis strengthened from a tropical storm to a category 5
  hurricane in about 24 hours.
Sunscreen and coral | Hawaii banned sunscreens containing oxybenzone and octinoxate from January
  2021.
Dog domestication | Dogs were domesticated from wolves at least 15,000 years ago.
Microchips in pets | Microchipped dogs were more than twice as likely to be returned to their
  owners.
Glaciers in Alaska | The Mendenhall Glacier has retreated more than 2.8 kilometers since 1929.
Birth weight | Babies born after 2000 in high-income countries have slightly lower average birth
  weights.
Street lighting | Switching to LED street lights cut energy use by about 50% in many cities.
Moss piglets | Tardigrades can survive temperatures close to absolute zero.
Paper recycling | Europe recycled about 71% of the paper it used in 2022.
Penguin colonies | Satellite images revealed a colony of about 1.5 million Adélie penguins on
  the Danger Islands.
"""


def benign_findings() -> list[tuple[str, str]]:
    entries = BENIGN_FINDINGS.strip().replace("\n  ", " ").splitlines()
    return [(topic, finding) for topic, _, finding in (e.partition(" | ") for e in entries)]


FINDINGS = QuerySpec.model_validate(SEED_CAT2)
_LINES = resources.files("peers.gateway").joinpath(VOCABULARY).read_text(encoding="utf-8")
VOCABULARY_WORDS = [line for line in _LINES.splitlines() if not line.startswith("#")]
VOCABULARY_SAMPLE = VOCABULARY_WORDS[:2000:3] + VOCABULARY_WORDS[2000::97]
CJK = "".join(chr(0x4E00 + i) for i in range(20_992))  # CJK Unified Ideographs, U+4E00-U+9FFF


def cjk_words(count: int, start: int) -> str:
    return " ".join(CJK[start + 64 * i : start + 64 * (i + 1)] for i in range(count))


# The capacity attack of the security review: 64-character CJK "words" in research-findings.


def test_cjk_words_cannot_carry_more_than_the_671_bits_charged():
    """A research-findings push of 64-character CJK words is refused, not delivered for 671 bits."""
    # As many 64-character words as each field's raw length limit lets through: 8 and 28.
    answer = {"q1": cjk_words(8, 0), "q2": cjk_words(28, 8 * 64), "q3": "5"}
    carried = sum(len(answer[key].replace(" ", "")) for key in ("q1", "q2")) * math.log2(len(CJK))
    assert carried > 33_000  # what the reader could choose from: 14.4 bits a character
    result = validate_response(FINDINGS, answer)
    if result.accepted:
        assert carried <= spec_bits(FINDINGS)
    assert not result.accepted


def test_a_wider_script_is_charged_for_what_it_carries():
    """A person_name field allows any script, at about 24 bits a character: long names fail."""
    name = QuerySpec.model_validate(
        {
            "category": 2,
            "questions": [
                {"id": "q1", "question": "Who?", "max_words": 10, "expected_format": "person_name"}
            ],
        }
    )
    assert validate_response(name, {"q1": "李小龙"}).accepted
    assert value_bits("李小龙", 10, "person_name") >= 3 * math.log2(len(CJK))
    result = validate_response(name, {"q1": CJK[:64]})
    assert not result.accepted
    assert "can carry" in result.detail()


# The documented code: lengths that satisfy Kraft's inequality, so at most 2^B values cost <= B.


def test_the_vocabulary_is_shipped_and_ranked():
    """The word list ships with the package, most frequent words first."""
    assert vocabulary_rank("the") == 1
    assert vocabulary_rank("insulin") is not None
    assert vocabulary_rank("The") is None  # ranks are of lowercase words
    assert vocabulary_rank("qwzx") is None


def test_words_satisfy_kraft():
    """The sum of 2^-bits over distinct words (every vocabulary word, short strings) is <= 1."""
    words = {"".join(p) for n in (1, 2, 3) for p in itertools.product("aZ1.,(é李-", repeat=n)}
    for rank in range(1, 32_769, 7):
        word = VOCABULARY_WORDS[rank - 1]
        words |= {word, word.title(), word.upper(), word + ",", "(" + word + ")"}
    assert math.fsum(2 ** -word_bits(w) for w in words) <= 1


def test_a_one_word_answer_has_at_most_2048_values():
    """Of every vocabulary word in every case, at most 2^11 fit an 11-bit one-word answer."""
    fits = [
        variant
        for word in VOCABULARY_WORDS
        for variant in (word, word.title(), word.upper())
        if value_bits(variant, 1, "short_text") <= 11
    ]
    assert 50 <= len(fits) <= 2**11


@pytest.mark.parametrize(
    ("expected_format", "values"),
    [
        ("integer", [str(i) for i in range(-99_999, 100_000)]),
        ("number", [f"{i / 100:.2f}".rstrip("0").rstrip(".") for i in range(-99_999, 100_000)]),
        ("yes_no", ["yes", "no"]),
    ],
)
def test_formats_satisfy_kraft(expected_format, values):
    """The integer, number and yes_no codes give distinct values lengths whose 2^-bits sum <= 1."""
    assert len(set(values)) == len(values)
    assert math.fsum(2 ** -value_bits(v, 1, expected_format) for v in values) <= 1


def test_a_date_costs_the_log_of_all_dates():
    """Any date carries log2(3,652,059) bits, and a date question is charged at least that."""
    assert DATE_BITS == pytest.approx(21.800, abs=1e-3)
    assert value_bits("2024-03-15", 1, "date") == DATE_BITS
    date = Question(id="d", question="When?", max_words=1, expected_format="date")
    assert question_bits(date) == DATE_BITS
    assert question_bits(date.model_copy(update={"max_words": 2})) == 22.0


@pytest.mark.parametrize(
    ("word", "low", "high"),
    [
        ("the", 3, 6),
        ("insulin", 14, 20),
        ("end.", 12, 20),
        ("Cloud's", 18, 28),
        ("2024", 15, 25),
        ("José", 20, 40),
        ("x" * MAX_WORD_CHARS, 300, 450),
    ],
)
def test_word_costs(word, low, high):
    """Common words cost a few bits, rare ones more, a 64-letter spelled word 5 to 7 a letter."""
    assert low <= word_bits(word) <= high


def test_alphabets():
    """An English field allows Latin and Greek letters and symbols; a name field any letter."""
    assert foreign_char("Zoë paid €5 for α-synuclein ≤ 3 µg", ENGLISH) is None
    assert foreign_char("a Москва b", ENGLISH) == "М"
    assert foreign_char("李小龙", ENGLISH) == "李"
    assert foreign_char("李小龙", NAMES) is None
    assert word_bits("李", ENGLISH) == math.inf


def test_answer_bits_of_cat1_and_cat3():
    """A Cat-1 answer carries exactly its charge; a summary its text's code length."""
    cat1 = QuerySpec.model_validate(SEED_CAT1)
    assert answer_bits(cat1, {"is_urgent": True}) == spec_bits(cat1)
    cat3 = QuerySpec(category=3, directive="Summarize.", max_words=8)
    assert answer_bits(cat3, {"summary": "the end"}) == value_bits("the end", 8)


# Adversarial values that pass validation carry no more than they are charged.

hostile_chars = st.one_of(
    st.characters(exclude_categories=()),
    st.sampled_from(
        "\u200b\u200d\u2060\ufeff\u202e\u00ad"  # zero-width, bidi, soft hyphen
        "аеорсху"  # Cyrillic lookalikes
        "ＡＢＣａｂｃ１２３"  # fullwidth, folded by NFKC
        "ﬁﬂ𝐀𝐚①㎏℃Ⅻ"  # ligatures, styled letters, compatibility forms
        "éñßøαβμ€°±"  # allowed beyond ASCII
        "李小龙"
    ),
    st.sampled_from("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789 .,-'()%"),
)
hostile_words = st.one_of(
    st.text(hostile_chars, min_size=1, max_size=MAX_WORD_CHARS + 4),
    st.sampled_from(VOCABULARY_SAMPLE),
    st.text("abcdefghijklmnopqrstuvwxyz", min_size=20, max_size=MAX_WORD_CHARS),
)
hostile_text = st.lists(hostile_words, min_size=1, max_size=60).map(" ".join)
formats = st.sampled_from(
    ["short_text", "short_list", "person_name", "email", "integer", "number", "date", "yes_no"]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(formats, st.integers(1, 12), hostile_text), min_size=1, max_size=3),
    st.sampled_from(["reject", "flag"]),
)
def test_accepted_cat2_answers_carry_no_more_than_charged(questions, action):
    """Whatever text a reader sends, an accepted answer is charged its code length, within the
    ceiling."""
    spec = QuerySpec.model_validate(
        {
            "category": 2,
            "questions": [
                {"id": f"q{i}", "question": "?", "max_words": w, "expected_format": f}
                for i, (f, w, _) in enumerate(questions)
            ],
        }
    )
    answer = {f"q{i}": text for i, (_, _, text) in enumerate(questions)}
    result = validate_response(spec, answer, anomaly_action=action)
    event("accepted" if result.accepted else "refused")
    if result.response is None:
        return
    # Steer the search toward answers that come closest to their ceiling.
    carried = answer_bits(spec, result.response)
    target(carried / spec_ceiling(spec))
    assert carried <= result.value_bits <= spec_ceiling(spec)
    for question in spec.questions or ():
        text = str(result.response[question.id])
        assert max(len(word) for word in text.split()) <= MAX_WORD_CHARS
        alphabet = NAMES if question.expected_format == "person_name" else ENGLISH
        assert foreign_char(text, alphabet) is None


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), hostile_text)
def test_accepted_summaries_carry_no_more_than_charged(max_words, text):
    """An accepted Cat-3 summary of hostile text is charged what it carries, within its ceiling
    and its alphabet."""
    spec = QuerySpec(category=3, directive="Summarize.", max_words=max_words)
    result = validate_response(spec, {"summary": text}, anomaly_action="flag")
    event("accepted" if result.accepted else "refused")
    if result.response is None:
        return
    carried = answer_bits(spec, result.response)
    target(carried / spec_ceiling(spec))
    assert carried <= result.value_bits <= spec_ceiling(spec)
    assert foreign_char(str(result.response["summary"]), ENGLISH) is None


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 12), hostile_text, st.floats(0, 400))
def test_an_answer_never_carries_more_than_was_reserved_for_it(max_words, text, max_bits):
    """With less of the budget left than the ceiling, what is accepted carries at most that."""
    q = {"id": "a", "question": "?", "max_words": max_words, "expected_format": "short_text"}
    spec = QuerySpec.model_validate({"category": 2, "questions": [q]})
    result = validate_response(spec, {"a": text}, max_bits=max_bits)
    if result.accepted:
        assert result.value_bits <= max_bits + 1e-9


@given(st.text(hostile_chars, min_size=1, max_size=80))
def test_word_bits_is_total_and_positive(word):
    """Every word has a cost above zero, infinite when its alphabet does not allow it."""
    word = "".join(word.split()) or "x"
    bits = word_bits(unicodedata.normalize("NFKC", word))
    assert bits > 0


# Ordinary answers stay cheap.


def test_benign_findings_are_rarely_refused_for_capacity():
    """At most 2% of 200 ordinary research-findings pushes are refused for what they carry."""
    findings = benign_findings()
    assert len(findings) == 200
    refused = []
    for topic, finding in findings:
        result = validate_response(FINDINGS, {"q1": topic, "q2": finding, "q3": "3"})
        assert not any("not allowed here" in r.message for r in result.reasons), topic
        if not result.accepted:
            refused.append((topic, result.detail()))
    assert len(refused) <= 0.02 * len(findings), refused


@pytest.mark.parametrize(
    "name",
    ["Jane Smith", "Katalin Karikó", "Kelvin Kiptum", "Drew Weissman", "Anne L'Huillier", "李小龙"],
)
def test_names_fit_a_ten_word_name_question(name):
    """Ordinary names in Latin or another script fit a 10-word person_name question."""
    assert value_bits(name, 10, "person_name") <= 110


def short_answers() -> list[tuple[str, int, str, str]]:
    """tests/peers/data/short_answers.txt: format, max_words, question, answer."""
    path = Path(__file__).resolve().parents[1] / "data" / "short_answers.txt"
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            fmt, words, question, answer = (part.strip() for part in line.split("|"))
            rows.append((fmt, int(words), question, answer))
    return rows


def test_ordinary_short_answers_are_rarely_refused_for_capacity():
    """At most 2% of 177 short factual answers, each to its own one-question spec, are refused.

    Names, places, numbers with units, titles, lists, e-mail addresses: what a reader answers a
    controller's short questions with. Each is within its word limit and its format.
    """
    rows = short_answers()
    assert len(rows) == 177
    refused = []
    for fmt, words, question, answer in rows:
        q = {"id": "a", "question": question, "max_words": words, "expected_format": fmt}
        result = validate_response(
            QuerySpec.model_validate({"category": 2, "questions": [q]}), {"a": answer}
        )
        assert all(r.code.value == "too_long" for r in result.reasons), (answer, result.detail())
        if not result.accepted:
            refused.append(answer)
    assert len(refused) <= 0.02 * len(rows), refused
