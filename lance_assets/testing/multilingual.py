"""A labelled multilingual sample for language identification, written for this project (no
download): ten plain sentences in each of twelve languages. ``documents`` builds short
(one sentence) and paragraph (three sentences) documents from them, each with its ISO 639-1
code. Used by ``lance_assets_tests/test_curation_language.py`` and
``benchmarks/curation_tags.py``."""

from __future__ import annotations

import random

SENTENCES: dict[str, list[str]] = {
    "en": [
        "The library opens at nine in the morning and closes late on Fridays.",
        "My brother planted tomatoes behind the house last spring.",
        "Please remember to bring an umbrella because it may rain this afternoon.",
        "The committee will announce its decision after the meeting next week.",
        "We walked along the river until the sun went down behind the hills.",
        "Children learn new words quickly when they hear them every day.",
        "The old bridge was repaired with stones taken from the quarry nearby.",
        "She wrote a long letter to her grandmother about the journey.",
        "Most of the students finished the exam before the bell rang.",
        "The price of bread has risen again since the beginning of the year.",
    ],
    "fr": [
        "La bibliothèque ouvre à neuf heures du matin et ferme tard le vendredi.",
        "Mon frère a planté des tomates derrière la maison au printemps dernier.",
        "N'oubliez pas d'apporter un parapluie car il risque de pleuvoir cet après-midi.",
        "Le comité annoncera sa décision après la réunion de la semaine prochaine.",
        "Nous avons marché le long de la rivière jusqu'au coucher du soleil.",
        "Les enfants apprennent vite de nouveaux mots quand ils les entendent chaque jour.",
        "Le vieux pont a été réparé avec des pierres venues de la carrière voisine.",
        "Elle a écrit une longue lettre à sa grand-mère à propos du voyage.",
        "La plupart des élèves ont terminé l'examen avant que la cloche ne sonne.",
        "Le prix du pain a encore augmenté depuis le début de l'année.",
    ],
    "de": [
        "Die Bibliothek öffnet um neun Uhr morgens und schließt freitags spät.",
        "Mein Bruder hat im letzten Frühling Tomaten hinter dem Haus gepflanzt.",
        "Denk bitte daran, einen Regenschirm mitzunehmen, weil es heute Nachmittag regnen kann.",
        "Der Ausschuss wird seine Entscheidung nach der Sitzung nächste Woche bekannt geben.",
        "Wir gingen am Fluss entlang, bis die Sonne hinter den Hügeln unterging.",
        "Kinder lernen neue Wörter schnell, wenn sie diese jeden Tag hören.",
        "Die alte Brücke wurde mit Steinen aus dem nahen Steinbruch repariert.",
        "Sie schrieb ihrer Großmutter einen langen Brief über die Reise.",
        "Die meisten Schüler waren mit der Prüfung fertig, bevor die Glocke läutete.",
        "Der Brotpreis ist seit Anfang des Jahres schon wieder gestiegen.",
    ],
    "es": [
        "La biblioteca abre a las nueve de la mañana y cierra tarde los viernes.",
        "Mi hermano plantó tomates detrás de la casa la primavera pasada.",
        "Recuerda traer un paraguas porque puede llover esta tarde.",
        "El comité anunciará su decisión después de la reunión de la próxima semana.",
        "Caminamos junto al río hasta que el sol se escondió detrás de las colinas.",
        "Los niños aprenden palabras nuevas rápidamente cuando las oyen todos los días.",
        "El puente viejo fue reparado con piedras traídas de la cantera cercana.",
        "Ella escribió una carta larga a su abuela sobre el viaje.",
        "La mayoría de los estudiantes terminó el examen antes de que sonara el timbre.",
        "El precio del pan ha vuelto a subir desde el comienzo del año.",
    ],
    "it": [
        "La biblioteca apre alle nove del mattino e chiude tardi il venerdì.",
        "Mio fratello ha piantato dei pomodori dietro la casa la primavera scorsa.",
        "Ricordati di portare un ombrello perché oggi pomeriggio potrebbe piovere.",
        "Il comitato annuncerà la sua decisione dopo la riunione della prossima settimana.",
        "Abbiamo camminato lungo il fiume finché il sole non è tramontato dietro le colline.",
        "I bambini imparano in fretta parole nuove quando le sentono ogni giorno.",
        "Il vecchio ponte è stato riparato con pietre prese dalla cava vicina.",
        "Ha scritto una lunga lettera alla nonna a proposito del viaggio.",
        "Quasi tutti gli studenti hanno finito l'esame prima che suonasse la campanella.",
        "Il prezzo del pane è aumentato di nuovo dall'inizio dell'anno.",
    ],
    "pt": [
        "A biblioteca abre às nove da manhã e fecha tarde às sextas-feiras.",
        "O meu irmão plantou tomates atrás da casa na primavera passada.",
        "Lembra-te de trazer um guarda-chuva porque pode chover esta tarde.",
        "A comissão vai anunciar a sua decisão depois da reunião da próxima semana.",
        "Caminhámos ao longo do rio até o sol se esconder atrás das colinas.",
        "As crianças aprendem palavras novas depressa quando as ouvem todos os dias.",
        "A ponte velha foi reparada com pedras trazidas da pedreira vizinha.",
        "Ela escreveu uma carta comprida à avó sobre a viagem.",
        "A maioria dos alunos acabou o exame antes de a campainha tocar.",
        "O preço do pão voltou a subir desde o início do ano.",
    ],
    "nl": [
        "De bibliotheek gaat om negen uur 's ochtends open en sluit op vrijdag laat.",
        "Mijn broer heeft afgelopen voorjaar tomaten achter het huis geplant.",
        "Vergeet niet een paraplu mee te nemen, want het kan vanmiddag gaan regenen.",
        "De commissie maakt haar besluit bekend na de vergadering van volgende week.",
        "We liepen langs de rivier tot de zon achter de heuvels onderging.",
        "Kinderen leren snel nieuwe woorden als ze die elke dag horen.",
        "De oude brug is hersteld met stenen uit de groeve in de buurt.",
        "Ze schreef haar grootmoeder een lange brief over de reis.",
        "De meeste leerlingen waren klaar met het examen voordat de bel ging.",
        "De prijs van brood is sinds het begin van het jaar weer gestegen.",
    ],
    "pl": [
        "Biblioteka jest otwarta od dziewiątej rano i zamyka się późno w piątki.",
        "Mój brat zasadził pomidory za domem zeszłej wiosny.",
        "Pamiętaj, żeby wziąć parasol, bo po południu może padać.",
        "Komisja ogłosi swoją decyzję po spotkaniu w przyszłym tygodniu.",
        "Szliśmy wzdłuż rzeki, aż słońce schowało się za wzgórzami.",
        "Dzieci szybko uczą się nowych słów, kiedy słyszą je codziennie.",
        "Stary most naprawiono kamieniami z pobliskiego kamieniołomu.",
        "Napisała do babci długi list o tej podróży.",
        "Większość uczniów skończyła egzamin, zanim zadzwonił dzwonek.",
        "Cena chleba znowu wzrosła od początku roku.",
    ],
    "ru": [
        "Библиотека открывается в девять утра и по пятницам закрывается поздно.",
        "Прошлой весной мой брат посадил помидоры за домом.",
        "Не забудь взять зонт, потому что днём может пойти дождь.",
        "Комитет объявит своё решение после собрания на следующей неделе.",
        "Мы шли вдоль реки, пока солнце не скрылось за холмами.",
        "Дети быстро учат новые слова, когда слышат их каждый день.",
        "Старый мост отремонтировали камнями из ближайшего карьера.",
        "Она написала бабушке длинное письмо о путешествии.",
        "Большинство студентов закончили экзамен до звонка.",
        "С начала года цена на хлеб снова выросла.",
    ],
    "tr": [
        "Kütüphane sabah dokuzda açılıyor ve cuma günleri geç kapanıyor.",
        "Kardeşim geçen bahar evin arkasına domates dikti.",
        "Öğleden sonra yağmur yağabileceği için şemsiye getirmeyi unutma.",
        "Komite kararını gelecek haftaki toplantıdan sonra açıklayacak.",
        "Güneş tepelerin ardında batana kadar nehir boyunca yürüdük.",
        "Çocuklar yeni kelimeleri her gün duyduklarında çabucak öğrenirler.",
        "Eski köprü yakındaki taş ocağından getirilen taşlarla onarıldı.",
        "Büyükannesine yolculuk hakkında uzun bir mektup yazdı.",
        "Öğrencilerin çoğu zil çalmadan önce sınavı bitirdi.",
        "Ekmeğin fiyatı yılın başından beri yine arttı.",
    ],
    "ja": [
        "図書館は朝九時に開き、金曜日は遅くまで開いています。",
        "兄は去年の春、家の裏にトマトを植えました。",
        "午後は雨が降るかもしれないので、傘を持ってきてください。",
        "委員会は来週の会議の後で決定を発表します。",
        "私たちは太陽が丘の向こうに沈むまで川沿いを歩きました。",
        "子供たちは毎日聞く言葉をすぐに覚えます。",
        "古い橋は近くの採石場の石を使って修理されました。",
        "彼女は旅行について祖母に長い手紙を書きました。",
        "ほとんどの学生はベルが鳴る前に試験を終えました。",
        "今年の初めからパンの値段がまた上がりました。",
    ],
    "zh": [
        "图书馆早上九点开门，星期五很晚才关门。",
        "我哥哥去年春天在房子后面种了西红柿。",
        "下午可能会下雨，请记得带一把伞。",
        "委员会将在下周的会议之后宣布决定。",
        "我们沿着河边散步，直到太阳落到山后面。",
        "孩子们每天听到新词，很快就能学会。",
        "这座旧桥是用附近采石场的石头修好的。",
        "她给奶奶写了一封长信，讲述这次旅行。",
        "大多数学生在铃声响起之前就完成了考试。",
        "从年初开始，面包的价格又上涨了。",
    ],
}
LANGUAGES = sorted(SENTENCES)


def documents(kind: str = "paragraph", seed: int = 0) -> list[tuple[str, str]]:
    """(text, ISO 639-1 code) pairs: ``short`` is every sentence alone (120 documents);
    ``paragraph`` is every sentence followed by two others of its language (120 documents)."""
    rng = random.Random(seed)
    out = []
    for lang in LANGUAGES:
        sentences = SENTENCES[lang]
        for i, sentence in enumerate(sentences):
            if kind == "short":
                out.append((sentence, lang))
                continue
            others = rng.sample([s for j, s in enumerate(sentences) if j != i], 2)
            sep = "" if lang in ("ja", "zh") else " "
            out.append((sep.join([sentence, *others]), lang))
    return out
