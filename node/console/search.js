// The search playground: query, channels, fusion, top-k and explain; hits with their text,
// heading path, pages and each channel's rank and score; failed shards as a warning.
import { api, enc } from './api.js';
import { h, replace, field, notice } from './dom.js';
import { t, placeLabel } from './i18n.js';
import { allKbs } from './kbs.js';

export function render(main, route) {
  const kb = h('select', { name: 'kb', required: true });
  const query = h('input', { name: 'query', type: 'search', required: true, autocomplete: 'off' });
  const dense = h('input', { type: 'checkbox', name: 'dense', checked: true, id: 'channel-dense' });
  const bm25 = h('input', { type: 'checkbox', name: 'bm25', checked: true, id: 'channel-bm25' });
  const graph = h('input', { type: 'checkbox', name: 'graph', checked: true, id: 'channel-graph' });
  const fusion = h(
    'select',
    { name: 'fusion' },
    h('option', { value: '' }, t('search.fusionDefault')),
    h('option', { value: 'rrf' }, 'RRF'),
    h('option', { value: 'dbsf' }, 'DBSF'),
  );
  const topK = h('input', { name: 'top_k', type: 'number', min: 1, max: 100, value: 10 });
  const explain = h('input', { type: 'checkbox', name: 'explain', id: 'search-explain', checked: true });
  const results = h('div', { class: 'results', 'aria-live': 'polite' });
  const options = retrievalOptions();
  const form = h(
    'form',
    { class: 'card', role: 'search', 'aria-labelledby': 'search-title' },
    h('div', { class: 'row' }, field(t('search.kb'), kb), h('div', { class: 'grow' }, field(t('search.query'), query))),
    h(
      'div',
      { class: 'row' },
      h('fieldset', {}, h('legend', {}, t('search.channels')),
        h('label', { class: 'check' }, dense, ' dense'),
        h('label', { class: 'check' }, bm25, ' bm25'),
        h('label', { class: 'check' }, graph, ' graph')),
      field(t('search.fusion'), fusion),
      field(t('search.topK'), topK),
      h('label', { class: 'check' }, explain, ` ${t('search.explain')}`),
    ),
    options.element,
    h('button', { type: 'submit', class: 'primary' }, t('search.submit')),
  );
  main.append(h('h1', { id: 'search-title' }, t('search.title')), form, results);
  allKbs().then((kbs) => {
    replace(kb, kbs.map((one) => h('option', { value: one.name }, one.name)));
    const wanted = route.query.get('kb');
    if (wanted) kb.value = wanted;
    if (kbs.length === 0) replace(results, h('p', { class: 'empty' }, t('kbs.none')));
  }, (failed) => replace(results, notice('error', failed.message)));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const checked = [dense.checked && 'dense', bm25.checked && 'bm25', graph.checked && 'graph'];
    const channels = checked.filter(Boolean);
    const body = { query: query.value, top_k: Number(topK.value), explain: explain.checked, ...options.read() };
    // All three checked: the node's default (every channel the KB has, so a KB without a
    // graph is searched by the other two); otherwise exactly those asked for.
    if (channels.length && channels.length < checked.length) body.channels = channels;
    if (fusion.value) body.fusion = fusion.value;
    replace(results, h('p', {}, t('search.searching')));
    try {
      const answer = await api('POST', `/v1/kbs/${enc(kb.value)}/search`, body);
      show(results, answer);
    } catch (failed) {
      replace(results, notice('error', `${failed.message} (${failed.code})`));
    }
  });
}

// The per-request retrieval options (ADR 0007); one left at "KB default" is not sent.
const OPTIONS = [
  ['rerank', 'bool'], ['rerank_depth', 'number'], ['rerank_model', 'text'],
  ['min_relative_score', 'number'], ['min_results', 'number'],
  ['mmr', 'bool'], ['mmr_lambda', 'number'], ['duplicate_similarity', 'number'],
  ['expand_parent', 'bool'], ['expand_neighbours', 'number'], ['context_tokens', 'number'],
  ['multi_query', 'bool'], ['follow_links', 'bool'], ['link_from', 'number'], ['links_per_hit', 'number'],
  ['graph_hops', 'number'], ['candidates', 'number'], ['rrf_k', 'number'], ['exact', 'bool'],
];

function retrievalOptions() {
  const controls = {};
  const fields = OPTIONS.map(([name, kind]) => {
    const control = kind === 'bool'
      ? h('select', { name },
        h('option', { value: '' }, t('search.kbDefault')),
        h('option', { value: 'true' }, t('search.on')),
        h('option', { value: 'false' }, t('search.off')))
      : h('input', { name, type: kind === 'number' ? 'number' : 'text', step: 'any', placeholder: t('search.kbDefault') });
    controls[name] = [kind, control];
    return field(name, control);
  });
  const dense = h('input', { name: 'weight_dense', type: 'number', step: 'any', min: 0, placeholder: t('search.kbDefault') });
  const bm25 = h('input', { name: 'weight_bm25', type: 'number', step: 'any', min: 0, placeholder: t('search.kbDefault') });
  const graph = h('input', { name: 'weight_graph', type: 'number', step: 'any', min: 0, placeholder: t('search.kbDefault') });
  const element = h('details', { class: 'more' }, h('summary', {}, t('search.options')),
    h('div', { class: 'row' }, field(t('search.weightDense'), dense), field(t('search.weightBm25'), bm25),
      field(t('search.weightGraph'), graph), fields));
  const read = () => {
    const body = {};
    for (const [name, [kind, control]] of Object.entries(controls)) {
      if (control.value === '') continue;
      body[name] = kind === 'bool' ? control.value === 'true' : kind === 'number' ? Number(control.value) : control.value;
    }
    if (dense.value !== '' || bm25.value !== '' || graph.value !== '') {
      body.weights = {};
      if (dense.value !== '') body.weights.dense = Number(dense.value);
      if (bm25.value !== '') body.weights.bm25 = Number(bm25.value);
      if (graph.value !== '') body.weights.graph = Number(graph.value);
    }
    return body;
  };
  return { element, read };
}

const number = (value, digits = 4) => (typeof value === 'number' ? value.toFixed(digits) : '—');

function show(results, answer) {
  const warnings = [];
  if (answer.failed_shards?.length) {
    warnings.push(notice('warning', t('search.failedShards', {
      shards: answer.failed_shards.map((shard) => `${shard.shard} (${shard.reason})`).join(', '),
    })));
  }
  for (const note of answer.notes || []) warnings.push(notice('info', note));
  if (answer.rerank && !answer.rerank.applied) {
    warnings.push(notice('info', t('search.rerankSkipped', { reason: answer.rerank.reason || '' })));
  }
  const context = answer.context ? h('details', { class: 'explain' },
    h('summary', {}, t('search.context', { tokens: answer.context.tokens, budget: answer.context.budget })),
    h('pre', { class: 'text' }, answer.context.text)) : null;
  const summary = h('p', { class: 'summary' }, t('search.summary', {
    n: answer.hits.length,
    ms: number(answer.timings?.total_ms, 1),
  }));
  const hits = answer.hits.map((hit, index) => h(
    'li',
    { class: 'hit card' },
    h('div', { class: 'hit-head' },
      h('span', { class: 'rank' }, `${index + 1}.`),
      h('strong', {}, hit.title || hit.external_id || hit.document_id),
      h('span', { class: 'score' }, `${t('search.score')} ${number(hit.score)}`)),
    hit.heading_path?.length ? h('p', { class: 'meta' }, hit.heading_path.join(' › ')) : null,
    h('p', { class: 'meta' }, [
      placeLabel(hit.pages, hit.heading_path),
      `${t('span')} ${hit.span?.[0]}–${hit.span?.[1]}`,
      ...channelsOf(hit).map(([channel, info]) =>
        `${channel} #${info.rank} (${number(info.score)})`),
    ].filter(Boolean).join(' · ')),
    h('p', { class: 'text' }, hit.text),
    hit.explain || hit.path ? explanation(hit) : null,
  ));
  replace(results, warnings, summary, context, h('ol', { class: 'hits' }, hits));
}

/** A hit's channels in the form's order (the answer's object has none to rely on). */
function channelsOf(hit) {
  const order = ['dense', 'bm25', 'graph'];
  return Object.entries(hit.channels || {}).sort(([a], [b]) => order.indexOf(a) - order.indexOf(b));
}

function explanation(hit) {
  const path = hit.path || {};
  const rows = [
    [t('search.fusedRank'), path.fused_rank],
    [t('search.fusedScore'), number(path.fused_score ?? hit.fused_score)],
    path.rerank_rank != null ? [t('search.rerankRank'), path.rerank_rank] : null,
    path.rerank_score != null ? [t('search.rerankScore'), number(path.rerank_score)] : null,
    ...channelsOf(hit).map(([channel, info]) => [
      channel,
      `#${info.rank} · ${t('search.score')} ${number(info.score)} · ${t('search.contribution')} ${number(info.contribution)}`,
    ]),
  ].filter(Boolean);
  return h(
    'details',
    { class: 'explain' },
    h('summary', {}, t('search.explainOpen')),
    hit.explain ? h('p', {}, hit.explain) : null,
    h('dl', {}, rows.map(([name, value]) => [h('dt', {}, name), h('dd', {}, value ?? '—')])),
    path.steps?.length ? h('ol', { class: 'steps' }, path.steps.map((step) => h('li', {}, step))) : null,
  );
}
