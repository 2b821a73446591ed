#!/usr/bin/env python3
"""Grid search of the embedded re-scorer's constants on SciFact (and only SciFact).

Usage: scripts/tune-rescorer.py NODE_URL KB [LISTS_JSON]
Dumps each judged query's dense top 100 and BM25 top 100 (channels alone, no rerank) from a
node holding the SciFact KB (or reads them from LISTS_JSON when it exists), then scores
`dense + b*bm25 + c*coverage + t*title` (features as in actors/src/retrieval/rescore.rs)
over a grid, printing the best settings by nDCG@10 (document level).
"""
import itertools, json, math, os, re, statistics, sys, urllib.request

D = os.path.join(os.path.dirname(__file__), '..', '..', 'shared', 'data', 'scifact')
node, kb = sys.argv[1], sys.argv[2]
cache = sys.argv[3] if len(sys.argv) > 3 else None
# The node's API key (SIFT_API_KEY), sent as a bearer token when set.
AUTH = {'authorization': 'Bearer ' + os.environ['SIFT_API_KEY']} if os.environ.get('SIFT_API_KEY') else {}
corpus = {}
for line in open(os.path.join(D, 'corpus.jsonl')):
    d = json.loads(line); corpus[d['_id']] = (d.get('title', ''), d['text'])
queries = {json.loads(l)['_id']: json.loads(l)['text'] for l in open(os.path.join(D, 'queries.jsonl'))}
qrels = {}
for i, line in enumerate(open(os.path.join(D, 'qrels', 'test.tsv'))):
    if i == 0: continue
    q, d, s = line.strip().split('\t')
    if int(s) > 0: qrels.setdefault(q, {})[d] = int(s)

def search(body):
    req = urllib.request.Request(f'{node}/v1/kbs/{kb}/search', data=json.dumps(body).encode(),
                                 headers={'content-type': 'application/json', **AUTH})
    return json.load(urllib.request.urlopen(req))

if cache and os.path.exists(cache):
    lists = json.load(open(cache))
else:
    lists = []
    for qid in qrels:
        one = lambda ch: [(h['external_id'], h['channels'][ch]['score'])
                          for h in search(dict(query=queries[qid], top_k=100, channels=[ch], rerank=False))['hits']]
        lists.append((qid, one('dense'), one('bm25')))
    if cache: json.dump(lists, open(cache, 'w'))

STOP = set("a an and are as at be but by for if in into is it no not of on or such that the their then there these they this to was will with what which who whom why how when where does do did has have had can could should would may might than from its we our you your i he she his her them also been being were more most other some any all each both few only own same so too very s t just over under about between after before during through".split())
def terms(s):
    out = []
    for t in re.findall(r'[0-9a-z]+|[\u4e00-\u9fff]', s.lower()):
        if len(t) == 1 and not ('\u4e00' <= t <= '\u9fff') and not t.isdigit(): continue
        if t in STOP: continue
        out.append(t[:6])
    return out
def ndcg(ranked, rel):
    dcg = sum(rel.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:10]))
    ideal = sorted(rel.values(), reverse=True)
    return dcg / sum(r / math.log2(i + 2) for i, r in enumerate(ideal[:10]))
def norm(l):
    vals = [v for _, v in l[:50]]
    if not vals: return {}
    mu = statistics.mean(vals); sd = statistics.pstdev(vals); lo = mu - 3 * sd; w = 6 * sd
    return {e: (min(max((v - lo) / w, 0), 1) if w > 1e-9 else 1.0) for e, v in l}
rows = []
for qid, dl, bl in lists:
    qt = set(terms(queries[qid])); dn = norm(dl); bn = norm(bl)
    cands = sorted(set(dn) | set(bn))
    toks = {e: set(terms(corpus[e][0] + ' ' + corpus[e][1])) for e in cands}
    tts = {e: set(terms(corpus[e][0])) for e in cands}
    n = len(cands)
    idf = {t: math.log(1 + (n + 1) / (1 + sum(t in toks[e] for e in cands))) for t in qt}
    tot = sum(idf.values()) or 1
    rows.append((qid, {e: (dn.get(e, 0.0), bn.get(e, 0.0),
                           sum(idf[t] for t in qt if t in toks[e]) / tot,
                           sum(idf[t] for t in qt if t in tts[e]) / tot) for e in cands}))
def evaluate(f):
    return sum(ndcg(sorted(feats, key=lambda e: (-f(feats[e]), e)), qrels[qid]) for qid, feats in rows) / len(rows)
print('dbsf (dense + bm25)', round(evaluate(lambda x: x[0] + x[1]), 4))
grid = []
for b, c, t in itertools.product([0.6, 0.8, 1.0, 1.2, 1.4, 1.6], [0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8], [0, 0.2, 0.3, 0.4, 0.6, 0.8]):
    grid.append((round(evaluate(lambda x: x[0] + b * x[1] + c * x[2] + t * x[3]), 4), b, c, t))
grid.sort()
for row in grid[-10:]: print('nDCG@10 %.4f  bm25 x%.1f coverage %.1f title %.1f' % row)
