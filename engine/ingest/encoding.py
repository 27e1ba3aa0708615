"""How a collection's writes turn documents into vectors: its model's encoders (loaded on
first use from ``encode/``), the vector fields the user fills (``VectorSpec``), whether writes
run the model, and the document-quality hook. The storage table holds one (storage imports
no encoder) and hands ``document_encoder()`` to each writer."""
from __future__ import annotations

from polyindex.errors import InvalidArgument


class Encoding:
    @staticmethod
    def assess(folder, w, m, texts):
        """The writer's document-quality hook (``ingest.quality.assess``), taken with the
        folder only; imported at the first write: a query never loads the quality model's
        scorer (a cold CLI query; issue 38)."""
        from polyindex.ingest import quality
        return quality.assess(folder, w, m, texts)

    def __init__(self, name: str, model: str | None, dtype: str, device: str, kinds: dict):
        """``kinds``: the table's kinds (the same dict; read at each call)."""
        self.name = name
        self.model = model  # the base model, fixed at the collection's creation, as its dtype
        self.dtype = dtype
        self.device = device
        self.kinds = kinds
        self._encoder = None
        # The encoder writes use: the base model, or an adapted one (``storage.encoders``:
        # its folder and fingerprint), set from each manifest a writer commits under
        # (``follow``); ``generation`` moves on each switch, so a write that encoded before
        # one re-encodes (``online.writes``).
        self.current: tuple[str | None, str | None] = (model, None)
        self.generation = 0

    def follow(self, current: tuple[str | None, str | None]) -> None:
        """Encode writes with ``current`` (model, fingerprint) from now on."""
        if current != self.current:
            self.current, self._encoder = current, None
            self.generation += 1

    def _load(self, current):
        if self.model is None:
            raise InvalidArgument(f"collection {self.name!r} has no model (model=None): give "
                                  "vectors, not text, to the vector indexes")
        from polyindex.encode.text import get_encoder
        return get_encoder(current[0], self.dtype, self.device, current[1])

    @property
    def encoder(self):
        enc = self._encoder
        if enc is None:
            enc = self._encoder = self._load(self.current)
        return enc

    def encoder_of(self, current):
        """The encoder of a snapshot's manifest (``storage.encoders.model_of``): a query
        encodes with the encoder that made the vectors it searches."""
        return self.encoder if current == self.current else self._load(current)

    def _encode_docs(self, texts, on_batch=None):
        return self.encoder.encode(texts, on_batch=on_batch)

    def _encode_docs_tokens(self, texts, on_batch=None):
        """(embeddings or None, per-document tokens) from one forward pass of the model."""
        from polyindex.encode.tokens import token_encoder_for
        salience = any(k.wants_salience for k in self.kinds.values())
        emb, tokens = token_encoder_for(self.encoder).encode_documents(
            texts, salience=salience, on_batch=on_batch)
        return (emb if any(k.needs_embeddings for k in self.kinds.values()) else None), tokens

    def document_encoder(self, device: str | None = None):
        """The writer's ``encode(texts, on_batch)``, or None when writes run no model;
        ``device``: where the model runs (a Ray encoder on a GPU), default the CPU."""
        if not self.encodes_text():
            return None
        if device not in (None, "cpu"):
            from polyindex.encode.text import get_encoder
            self._encoder = get_encoder(self.current[0], self.dtype, device, self.current[1])
        if any(k.needs_tokens for k in self.kinds.values()):
            return self._encode_docs_tokens
        return self._encode_docs

    def fill_queries(self, queries, vectors: bool, tokens: bool, current=None) -> None:
        """Encode the texts of the queries that lack what the profile reads, with one forward
        pass per query: the dense vector (``q.vector``) and, when ``tokens``, the model's
        query tokens (``q.extra["tokens"]``, which the multivector kind takes as given).
        ``current``: a callable giving the searched snapshot's encoder (default: the writes'
        one), called only when something is encoded."""
        need = [i for i, q in enumerate(queries) if q.text and (
            (vectors and q.vector is None) or (tokens and "tokens" not in q.extra))]
        if not need:
            return
        texts = [queries[i].text for i in need]
        encoder = self.encoder if current is None else self.encoder_of(current())
        if tokens:
            from polyindex.encode.tokens import token_encoder_for
            vecs, toks = token_encoder_for(encoder).encode_queries_both(texts)
            for i, t in zip(need, toks):
                queries[i].extra.setdefault("tokens", t)
        else:
            vecs = encoder.encode(texts, chunk=len(texts))
        if vectors:
            for i, v in zip(need, vecs):
                if queries[i].vector is None:
                    queries[i].vector = v

    def vector_spec(self):
        """The vector fields the user fills (a fresh ``VectorSpec`` per write: dimensions not
        yet known are fixed by the write's first vector)."""
        from polyindex.ingest.vectors import VectorSpec
        return VectorSpec.of(self.kinds, self.model)

    def encodes_text(self) -> bool:
        """Whether writes run the collection's model (the unnamed field comes from text)."""
        return self.model is not None and \
            "dense" not in self.vector_spec().fields and \
            any(k.needs_embeddings or k.needs_tokens for k in self.kinds.values())


def token_encoder(model: str, dtype: str, device: str = "cpu", current=None):
    """The collection model's token encoder, for kinds that encode (multivector); a plain
    function, so the kinds hold no reference back to their collection. ``current``: a
    one-item list holding the table's (model, fingerprint) now (an adapted encoder)."""
    from polyindex.encode.tokens import get_token_encoder
    if current is not None and current[0][0] is not None:
        model, fp = current[0]
        return get_token_encoder(model, dtype, device, fp)
    return get_token_encoder(model, dtype, device)
