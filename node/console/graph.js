// A KB's entity graph (GraphRAG, ADR 0037): entities found as you type, one entity's
// neighbourhood drawn as a force-directed picture (its neighbours around it, a thicker line for
// more chunks shared; a neighbour recentres the picture), the chunks that mention it, and the
// path between two entities, and the KB's communities (ADR 0039: groups of entities mentioned
// together, with their passages and, when asked, a summary by the node's chat model).
// `#/graph?kb=KB&entity=ID` opens an entity.
import { api, enc } from './api.js';
import { h, replace, field, notice, openDialog } from './dom.js';
import { t, placeLabel } from './i18n.js';
import { allKbs } from './kbs.js';
import { showChunks } from './documents.js';

/** Neighbours drawn around an entity (the API lists up to 100, most shared chunks first). */
const MAX_NEIGHBOURS = 40;
/** The picture's size in its own units: wide, or narrow on a phone (its labels stay legible). */
const WIDE = { width: 720, height: 440 };
const NARROW = { width: 400, height: 460 };
const SVG = 'http://www.w3.org/2000/svg';

export function render(main, route) {
  const state = { kb: '', searches: 0, shown: 0, timer: null, details: new Map() };
  const kb = h('select', { name: 'kb' });
  const query = h('input', { name: 'entity', type: 'search', autocomplete: 'off', spellcheck: 'false' });
  const matches = h('div', { class: 'entity-matches', 'aria-live': 'polite' });
  const view = h('section', { class: 'graph-view' });
  const path = pathForm(state);
  const communities = communitiesForm(state);
  const form = h('form', { class: 'card', role: 'search', 'aria-labelledby': 'graph-title' },
    h('div', { class: 'row' }, field(t('graph.kb'), kb),
      h('div', { class: 'grow' }, field(t('graph.find'), query, t('graph.findHint')))),
    matches);
  main.append(h('h1', { id: 'graph-title' }, t('graph.title')), form, view, path.element, communities.element);
  const kbs = new Map();
  state.select = (entity) => select(state, view, path, entity);
  const useKb = () => {
    state.kb = kb.value;
    state.details.clear();
    replace(matches);
    path.clear();
    communities.clear();
    // the KB's record says whether it has a graph; the API would answer `graph_unavailable`
    const off = kbs.get(state.kb)?.settings?.graph === 'off';
    query.disabled = off;
    path.setEnabled(!off);
    communities.setEnabled(!off);
    replace(view, off ? notice('warning', t('graph.unavailable')) : h('p', { class: 'empty' }, t('graph.pick')));
    if (!off && query.value) findEntities(state, query.value, matches);
  };
  kb.addEventListener('change', () => {
    history.replaceState(null, '', `#/graph?kb=${enc(kb.value)}`);
    useKb();
  });
  query.addEventListener('input', () => {
    clearTimeout(state.timer);
    state.timer = setTimeout(() => findEntities(state, query.value, matches), 250);
  });
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    clearTimeout(state.timer);
    findEntities(state, query.value, matches);
  });
  allKbs().then((list) => {
    for (const one of list) kbs.set(one.name, one);
    replace(kb, list.map((one) => h('option', { value: one.name }, one.name)));
    if (list.length === 0) {
      replace(view, h('p', { class: 'empty' }, t('kbs.none')));
      return;
    }
    const wanted = route.query.get('kb');
    if (wanted && kbs.has(wanted)) kb.value = wanted;
    useKb();
    const entity = route.query.get('entity');
    if (entity && !query.disabled) state.select(entity);
  }, (failed) => replace(view, notice('error', failed.message)));
  return () => clearTimeout(state.timer);
}

/** Lists the entities whose name starts with `text`; an answer overtaken by a newer one is dropped. */
async function findEntities(state, text, matches) {
  const search = ++state.searches;
  const q = text.trim();
  // a query with no letter or digit is refused by the API (`invalid_query`): not sent
  if (!/[\p{L}\p{N}]/u.test(q)) {
    replace(matches);
    return;
  }
  let answer;
  try {
    answer = await api('GET', `/v1/kbs/${enc(state.kb)}/graph/entities?q=${enc(q)}&limit=12`);
  } catch (failed) {
    if (search === state.searches) replace(matches, apiNotice(failed));
    return;
  }
  if (search !== state.searches) return;
  if (answer.entities.length === 0) {
    replace(matches, h('p', { class: 'empty' }, t('graph.noMatches', { q })));
    return;
  }
  replace(matches, h('ul', { class: 'entities', 'aria-label': t('graph.matches') }, answer.entities.map((entity) => h('li', {},
    h('button', { type: 'button', class: 'entity', dataset: { entity: entity.id }, onclick: () => state.select(entity.id) },
      h('span', { class: 'name' }, entity.name), ' ',
      h('span', { class: 'badge' }, kindLabel(entity.kind)), ' ',
      h('span', { class: 'meta' }, chunkCount(entity.chunks)))))));
}

/** The API's refusal in words: the graph's own codes translated, others as the API says them. */
function apiNotice(failed, name) {
  if (failed.code === 'graph_unavailable') return notice('warning', t('graph.unavailable'));
  if (failed.code === 'entity_not_found') return notice('warning', t('graph.notFound', { name }));
  return notice('error', `${failed.message} (${failed.code})`);
}

const kindLabel = (kind) => t(`graph.kind.${kind}`);
const chunkCount = (n) => (n === 1 ? t('graph.oneChunk') : t('graph.chunks', { n }));

/** An entity with its neighbours and mentions, read once per KB shown. */
async function detail(state, entity) {
  if (!state.details.has(entity)) {
    const reading = api('GET', `/v1/kbs/${enc(state.kb)}/graph/entities/${enc(entity)}`);
    state.details.set(entity, reading);
    reading.catch(() => state.details.delete(entity));
  }
  return state.details.get(entity);
}

/** Shows `entity` (an id or a name): the picture of its neighbourhood and its mentions. */
async function select(state, view, path, entity) {
  const shown = ++state.shown;
  replace(view, h('p', {}, t('loading')));
  let answer;
  try {
    answer = await detail(state, entity);
  } catch (failed) {
    if (shown === state.shown) replace(view, apiNotice(failed, entity));
    return;
  }
  if (shown !== state.shown) return;
  history.replaceState(null, '', `#/graph?kb=${enc(state.kb)}&entity=${enc(answer.entity.id)}`);
  path.suggest(answer.entity.name);
  const { entity: centre, neighbours, mentions, events = [] } = answer;
  const drawn = neighbours.slice(0, MAX_NEIGHBOURS);
  const heading = h('h2', { id: 'graph-entity', tabindex: -1 }, centre.name, ' ',
    h('span', { class: 'badge' }, kindLabel(centre.kind)), ' ',
    h('span', { class: 'meta' }, chunkCount(centre.chunks)));
  const caption = h('figcaption', { id: 'graph-caption', class: 'meta' },
    t('graph.caption', { name: centre.name, n: neighbours.length }),
    drawn.length < neighbours.length ? ` ${t('graph.more', { shown: drawn.length })}` : '');
  replace(view,
    h('div', { class: 'card' }, heading,
      h('figure', {}, picture(state, centre, drawn, view.clientWidth < 560 ? NARROW : WIDE), caption)),
    h('section', { class: 'card', 'aria-labelledby': 'graph-mentions' },
      h('h2', { id: 'graph-mentions' }, t('graph.mentions', { name: centre.name })),
      h('ol', { class: 'mentions' }, mentions.map((chunk) => h('li', {},
        h('button', { type: 'button', class: 'link', onclick: () => openChunk(state.kb, chunk, centre.name) },
          chunk.title || chunk.external_id || chunk.document_id),
        chunkMeta(chunk),
        h('p', { class: 'text' }, highlighted(excerpt(chunk.text, centre.name), centre.name)))))),
    events.length ? eventList(state, centre, events, mentions) : null,
  );
  if (view.contains(document.activeElement) || document.activeElement === document.body) {
    heading.focus({ preventScroll: true });
  }
}

/** The events a model found that name `centre`, each opening the chunk it came from. */
function eventList(state, centre, events, mentions) {
  return h('section', { class: 'card', 'aria-labelledby': 'graph-events' },
    h('h2', { id: 'graph-events' }, t('graph.events', { name: centre.name })),
    h('ol', { class: 'events' }, events.map((event) => {
      const chunk = mentions.find((one) => one.chunk_id === event.chunk_id);
      const said = [event.subject, event.predicate, event.object].filter(Boolean).join(' ');
      return h('li', {},
        chunk
          ? h('button', { type: 'button', class: 'link', onclick: () => openChunk(state.kb, chunk, centre.name) }, said)
          : said,
        ' ',
        h('span', { class: 'meta' }, [event.time, event.place].filter(Boolean).join(' · ')));
    })));
}

function chunkMeta(chunk) {
  return h('p', { class: 'meta' }, [
    (chunk.heading_path || []).join(' › '),
    placeLabel(chunk.pages, chunk.heading_path),
    `${t('span')} ${chunk.span?.[0]}–${chunk.span?.[1]}`,
  ].filter(Boolean).join(' · '));
}

function svg(tag, attributes = {}, ...children) {
  const element = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value !== null && value !== undefined) element.setAttribute(name, String(value));
  }
  element.append(...children);
  return element;
}

/** The neighbourhood in SVG: the entity in the centre, each neighbour a focusable button. */
function picture(state, centre, neighbours, size) {
  const most = Math.max(1, ...neighbours.map((one) => one.shared_chunks));
  const points = layout(centre.id, neighbours.map((one) => one.shared_chunks / most), size);
  const radius = (chunks) => Math.min(18, 6 + 3 * Math.log2(1 + chunks));
  const edges = neighbours.map((one, index) => svg('line', {
    x1: 0, y1: 0, x2: points[index + 1].x, y2: points[index + 1].y,
    'stroke-width': (1 + 5 * (one.shared_chunks / most)).toFixed(1),
  }));
  const node = (entity, [x, y], label, centred) => {
    const group = svg('g', { class: centred ? 'graph-node centre' : 'graph-node', transform: `translate(${x} ${y})`, 'aria-label': label, role: centred ? 'img' : 'button', tabindex: centred ? null : 0, 'data-entity': entity.id },
      svg('circle', { r: radius(entity.chunks).toFixed(1) }),
      svg('text', { y: (radius(entity.chunks) + 13).toFixed(1) }, shortName(entity.name)));
    if (!centred) {
      group.addEventListener('click', () => state.select(entity.id));
      group.addEventListener('keydown', (event) => {
        if (event.key !== 'Enter' && event.key !== ' ') return;
        event.preventDefault();
        state.select(entity.id);
      });
    }
    return group;
  };
  const nodes = neighbours.map((one, index) => node(one, [points[index + 1].x, points[index + 1].y],
    t('graph.neighbour', { name: one.name, kind: kindLabel(one.kind), n: one.shared_chunks }), false));
  return svg('svg', { viewBox: `${-size.width / 2} ${-size.height / 2} ${size.width} ${size.height}`, role: 'group', 'aria-label': t('graph.view', { name: centre.name }), 'aria-describedby': 'graph-caption' },
    svg('g', { class: 'graph-edges' }, ...edges),
    ...nodes,
    node(centre, [0, 0], t('graph.centreLabel', { name: centre.name, kind: kindLabel(centre.kind), chunks: chunkCount(centre.chunks) }), true));
}

const shortName = (name) => (name.length > 22 ? `${name.slice(0, 21)}…` : name);

/** A generator of numbers in [0, 1) from a 32-bit seed (mulberry32). */
function random(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let x = Math.imul(a ^ (a >>> 15), 1 | a);
    x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x;
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * Positions for the centre (first, at 0,0) and a neighbour per weight in (0, 1]: 300 steps of
 * repulsion between every pair and a spring from each neighbour to the centre, shorter the
 * heavier its weight, moves shrinking as it cools; then scaled to fit `width` × `height`. The start is
 * drawn from a generator seeded by the entity's id: one entity always comes out the same.
 */
export function layout(id, weights, { width, height }) {
  const next = random(parseInt(String(id).slice(-8), 16) || 1);
  const points = [{ x: 0, y: 0 }, ...weights.map((weight, index) => {
    const angle = index * 2.399963 + next() * 0.5;
    const distance = 60 + next() * 60;
    return { x: Math.cos(angle) * distance, y: Math.sin(angle) * distance, weight };
  })];
  const steps = 300;
  for (let step = 0; step < steps; step += 1) {
    const limit = 12 * (1 - step / steps) + 0.5;
    const forces = points.map(() => ({ x: 0, y: 0 }));
    for (let a = 0; a < points.length; a += 1) {
      for (let b = a + 1; b < points.length; b += 1) {
        const dx = points[a].x - points[b].x;
        const dy = points[a].y - points[b].y;
        const squared = Math.max(dx * dx + dy * dy, 1);
        const push = 4000 / squared / Math.sqrt(squared);
        forces[a].x += dx * push; forces[a].y += dy * push;
        forces[b].x -= dx * push; forces[b].y -= dy * push;
      }
    }
    for (let index = 1; index < points.length; index += 1) {
      const point = points[index];
      const distance = Math.max(Math.hypot(point.x, point.y), 0.01);
      const pull = 0.05 * (distance - (70 + 110 * (1 - point.weight))) / distance;
      const force = forces[index];
      force.x -= point.x * pull;
      force.y -= point.y * pull;
      const length = Math.hypot(force.x, force.y);
      const scale = length > limit ? limit / length : 1;
      point.x += force.x * scale;
      point.y += force.y * scale;
    }
  }
  // fit: room for the labels under the nodes and to either side
  const wide = Math.max(1, ...points.map((point) => Math.abs(point.x)));
  const high = Math.max(1, ...points.map((point) => Math.abs(point.y)));
  const scale = Math.min((width / 2 - 70) / wide, (height / 2 - 36) / high, 1.6);
  return points.map((point) => ({ x: Math.round(point.x * scale * 10) / 10, y: Math.round(point.y * scale * 10) / 10 }));
}

/** About 360 characters of `text` around the first mention of `name`. */
function excerpt(text, name) {
  if (text.length <= 360) return text;
  const at = Math.max(0, text.toLowerCase().indexOf(name.toLowerCase()));
  const start = Math.max(0, at - 120);
  const end = Math.min(text.length, start + 360);
  return `${start > 0 ? '…' : ''}${text.slice(start, end)}${end < text.length ? '…' : ''}`;
}

/** `text` with every mention of the `names` (case folded, any run of spaces) in a `<mark>`. */
function highlighted(text, ...names) {
  const patterns = names.filter((name) => name && name.trim()).map((name) => name.trim().split(/\s+/)
    .map((word) => word.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('\\s+'));
  if (patterns.length === 0) return text;
  const pattern = new RegExp(`(${patterns.join('|')})`, 'giu');
  return text.split(pattern).map((piece, index) => (index % 2 ? h('mark', {}, piece) : piece));
}

/** A chunk in the dialog, the entity marked, with a way to its whole document. */
function openChunk(kb, chunk, name) {
  const title = chunk.title || chunk.external_id || chunk.document_id;
  const whole = h('button', { type: 'button', onclick: () => showChunks(kb, { id: chunk.document_id, title }, chunk.chunk_id) },
    t('graph.wholeDocument'));
  openDialog(title, chunkMeta(chunk), h('blockquote', { class: 'cited chunk-text' }, highlighted(chunk.text, name)), h('p', {}, whole));
}

/** The path form: two names (or ids) and at most how many hops; the answer as its steps. */
function pathForm(state) {
  const from = h('input', { name: 'from', autocomplete: 'off', required: true });
  const to = h('input', { name: 'to', autocomplete: 'off', required: true });
  const hops = h('select', { name: 'max_hops' }, [1, 2, 3].map((n) => h('option', { value: n, selected: n === 3 }, n)));
  const submit = h('button', { type: 'submit', class: 'primary' }, t('graph.findPath'));
  const result = h('div', { class: 'path-result', 'aria-live': 'polite' });
  const element = h('form', { class: 'card', 'aria-labelledby': 'graph-path-title' },
    h('h2', { id: 'graph-path-title' }, t('graph.path')),
    h('div', { class: 'row' }, h('div', { class: 'grow' }, field(t('graph.from'), from)),
      h('div', { class: 'grow' }, field(t('graph.to'), to)), field(t('graph.maxHops'), hops), submit),
    result);
  element.addEventListener('submit', async (event) => {
    event.preventDefault();
    replace(result, h('p', {}, t('loading')));
    const [a, b] = [from.value.trim(), to.value.trim()];
    let answer;
    try {
      answer = await api('GET', `/v1/kbs/${enc(state.kb)}/graph/paths?from=${enc(a)}&to=${enc(b)}&max_hops=${hops.value}`);
    } catch (failed) {
      replace(result, apiNotice(failed, `${a} / ${b}`));
      return;
    }
    if (!answer.found) {
      replace(result, notice('info', t('graph.noPath', { from: a, to: b, hops: hops.value })));
      return;
    }
    replace(result, h('p', { class: 'meta' }, t('graph.hops', { n: answer.hops })),
      h('ol', { class: 'path' }, answer.steps.map((step, index) => [
        h('li', { class: 'path-entity' }, h('button', { type: 'button', class: 'entity', onclick: () => state.select(step.entity.id) },
          h('span', { class: 'name' }, step.entity.name || step.entity.id), ' ', h('span', { class: 'badge' }, kindLabel(step.entity.kind)))),
        step.via_chunk ? viaChunk(state, step, answer.steps[index + 1]) : null,
      ])));
  });
  return {
    element,
    clear: () => replace(result),
    setEnabled: (on) => { for (const control of [from, to, hops, submit]) control.disabled = !on; },
    suggest: (name) => { if (!from.value) from.value = name; },
  };
}

/** The communities form: whether to summarise, and the answer as a list, largest first. */
function communitiesForm(state) {
  const summaries = h('input', { type: 'checkbox', name: 'summaries' });
  const submit = h('button', { type: 'submit', class: 'primary' }, t('graph.showCommunities'));
  const result = h('div', { class: 'communities-result', 'aria-live': 'polite' });
  const element = h('form', { class: 'card', 'aria-labelledby': 'graph-communities-title' },
    h('h2', { id: 'graph-communities-title' }, t('graph.communities')),
    h('p', { class: 'hint' }, t('graph.communitiesHint')),
    h('div', { class: 'row' }, h('label', { class: 'check' }, summaries, ` ${t('graph.summarise')}`), submit),
    result);
  element.addEventListener('submit', async (event) => {
    event.preventDefault();
    replace(result, h('p', {}, t('loading')));
    let answer;
    try {
      answer = await api('GET', `/v1/kbs/${enc(state.kb)}/graph/communities?limit=10${summaries.checked ? '&summaries=true' : ''}`);
    } catch (failed) {
      replace(result, apiNotice(failed));
      return;
    }
    if (answer.communities.length === 0) {
      replace(result, notice('info', t('graph.noCommunities')));
      return;
    }
    replace(result, h('ol', { class: 'communities' }, answer.communities.map((community) => h('li', { class: 'community', dataset: { community: community.id } },
      h('p', { class: 'meta' }, t('graph.community', { size: community.size, chunks: chunkCount(community.chunks) })),
      community.summary ? h('p', { class: 'summary' }, community.summary) : null,
      community.summary_error ? h('p', { class: 'meta' }, t('graph.noSummary', { reason: community.summary_error })) : null,
      h('ul', { class: 'members' }, community.members.map((member) => h('li', {},
        h('button', { type: 'button', class: 'entity', onclick: () => state.select(member.id) },
          h('span', { class: 'name' }, member.name), ' ', h('span', { class: 'badge' }, kindLabel(member.kind)))))),
      h('ul', { class: 'passages' }, community.passages.map((chunk) => h('li', {},
        h('button', { type: 'button', class: 'link', onclick: () => openChunk(state.kb, chunk, community.members[0]?.name) },
          chunk.title || chunk.document_id),
        h('p', { class: 'text meta' }, excerpt(chunk.text, community.members[0]?.name || '')))))))));
  });
  return {
    element,
    clear: () => replace(result),
    setEnabled: (on) => { for (const control of [summaries, submit]) control.disabled = !on; },
  };
}

/** The chunk joining two steps of a path, named by its document once the entity's mentions are read. */
function viaChunk(state, step, after) {
  const label = h('span', {}, t('graph.viaChunk', { chunk: step.via_chunk }));
  const item = h('li', { class: 'path-chunk' }, '↓ ', label);
  detail(state, step.entity.id).then((answer) => {
    const chunk = answer.mentions.find((one) => one.chunk_id === step.via_chunk);
    if (!chunk) return;
    replace(item, '↓ ', h('button', { type: 'button', class: 'link', onclick: () => openChunk(state.kb, chunk, step.entity.name) },
      t('graph.via', { title: chunk.title || chunk.document_id })),
    ' ', h('span', { class: 'meta' }, (chunk.heading_path || []).join(' › ')),
    h('p', { class: 'text meta' }, highlighted(excerpt(chunk.text, step.entity.name), step.entity.name, after?.entity.name)));
  }, () => {});
  return item;
}
