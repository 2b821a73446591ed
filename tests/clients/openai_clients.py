"""Real OpenAI clients against a Sift node, unchanged: the official `openai` SDK and
LangChain's `ChatOpenAI`, streaming and not, with no Sift extension field.

Usage: python openai_clients.py BASE_URL API_KEY MODEL EMBEDDING_MODEL
Run by tests/tests/clients.rs against a node whose chat model is the fake server; exits
non-zero with the reason when a client does not get what it should.
"""

import sys

import openai
from langchain_openai import ChatOpenAI, OpenAIEmbeddings

base, key, model, embedding_model = sys.argv[1:5]
QUESTION = "What does the first study find?"
client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)


def check(condition, what):
    if not condition:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


# The models, as the SDK lists and retrieves them.
ids = [m.id for m in client.models.list().data]
check(model in ids, f"{model} is listed among {ids}")
check(client.models.retrieve(model).id == model, f"{model} is retrieved")

# Not streamed: a cited answer, its citations as annotations the SDK parses.
completion = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": QUESTION}]
)
message = completion.choices[0].message
check("[1]" in (message.content or ""), f"the answer cites [1]: {message.content!r}")
annotations = message.annotations or []
check(len(annotations) > 0, "the message has annotations")
first = annotations[0]
check(first.type == "url_citation", "an annotation is a url_citation")
marker = message.content[first.url_citation.start_index : first.url_citation.end_index]
check(marker.startswith("[") and marker.endswith("]"), f"it spans a marker: {marker!r}")
check(completion.usage is not None and completion.usage.total_tokens >= 0, "usage")

# Streamed, with the usage chunk the SDK asks for.
text, usage = "", None
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": QUESTION}],
    stream=True,
    stream_options={"include_usage": True},
)
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        text += chunk.choices[0].delta.content
    if chunk.usage is not None:
        usage = chunk.usage
check("[1]" in text, f"the streamed answer cites [1]: {text!r}")
check(usage is not None, "the stream ends with a usage chunk")

# Errors the SDK raises with their code, type and param.
try:
    client.chat.completions.create(
        model="kb:no-such-kb", messages=[{"role": "user", "content": QUESTION}]
    )
    check(False, "an unknown model is refused")
except openai.NotFoundError as error:
    check(error.code == "model_not_found", f"404 model_not_found ({error.code})")
    check(error.param == "model", f"param is model ({error.param})")
try:
    client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], n=2
    )
    check(False, "n=2 is refused")
except openai.BadRequestError as error:
    check(error.param == "n", f"n=2 refused naming n ({error.param})")
    check(error.type == "invalid_request_error", f"type ({error.type})")

# LangChain, unchanged: invoke and stream.
chat = ChatOpenAI(base_url=f"{base}/v1", api_key=key, model=model, max_retries=0)
reply = chat.invoke(QUESTION)
check("[1]" in reply.content, f"LangChain's answer cites [1]: {reply.content!r}")
streamed = "".join(chunk.content for chunk in chat.stream(QUESTION))
check("[1]" in streamed, f"LangChain's streamed answer cites [1]: {streamed!r}")

# Embeddings from the node's embedding model: the SDK asks for base64 and decodes it.
texts = ["aspirin and heart attacks", "aspirin and heart attacks", "the weather on Mars"]
vectors = [d.embedding for d in client.embeddings.create(model=embedding_model, input=texts).data]
check(len(vectors) == 3 and len(vectors[0]) == 384, "three vectors of 384 dimensions")
check(vectors[0] == vectors[1] and vectors[0] != vectors[2], "equal texts, equal vectors")
floats = client.embeddings.create(model=embedding_model, input="x", encoding_format="float")
check(len(floats.data[0].embedding) == 384, "float encoding")
# LangChain's embeddings, with its own token counting off (it would fetch tiktoken's files)
embeddings = OpenAIEmbeddings(
    base_url=f"{base}/v1", api_key=key, model=embedding_model, check_embedding_ctx_length=False
)
check(len(embeddings.embed_query("aspirin")) == 384, "LangChain embeds a query")
print("all OpenAI client checks passed")
