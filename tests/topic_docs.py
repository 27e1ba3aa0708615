"""A handful of documents on unrelated topics: a query about one finds it first under any
sensible scorer (shared by the index-kind tests)."""

TOPIC_DOCS = [
    {"_id": "wing", "title": "Wing flutter", "text": "Aeroelastic flutter of a swept wing at transonic speed."},
    {"_id": "heat", "title": "Heat transfer", "text": "Heat transfer to a blunt body in hypersonic flow."},
    {"_id": "cake", "title": "Chocolate cake", "text": "Bake the chocolate cake for forty minutes with butter and sugar."},
    {"_id": "pasta", "title": "Pasta", "text": "Boil the spaghetti in salted water, add tomato sauce."},
    {"_id": "soccer", "title": "Football", "text": "The striker scored a late goal in the cup final."},
    {"_id": "chess", "title": "Chess openings", "text": "The Sicilian defence is a sharp reply to the king pawn opening."},
]
