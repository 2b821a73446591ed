// The cluster: its nodes with their Raft role, health and address, the rebalancing in
// progress (drains, replicas being filled, the next steps; operators only), and a KB's shards
// with their replicas and states.
import { api, enc } from './api.js';
import { h, replace, field, notice, formatTime } from './dom.js';
import { t } from './i18n.js';
import { allKbs } from './kbs.js';

export function render(main, route) {
  const nodes = h('section', { 'aria-labelledby': 'nodes-title', 'aria-live': 'polite' }, t('loading'));
  const rebalancing = h('section', { class: 'rebalancing', 'aria-labelledby': 'rebalancing-title', 'aria-live': 'polite' });
  const kb = h('select', { name: 'kb' });
  const shards = h('div', { 'aria-live': 'polite' });
  main.append(
    h('h1', {}, t('cluster.title')),
    nodes,
    rebalancing,
    h('section', { 'aria-labelledby': 'shards-title' }, h('h2', { id: 'shards-title' }, t('cluster.shards')), field(t('search.kb'), kb), shards),
  );
  loadNodes(nodes, rebalancing);
  allKbs().then((kbs) => {
    replace(kb, kbs.map((one) => h('option', { value: one.name }, one.name)));
    const wanted = route.query.get('kb');
    if (wanted) kb.value = wanted;
    if (kb.value) loadShards(shards, kb.value);
    else replace(shards, h('p', { class: 'empty' }, t('kbs.none')));
  }, (failed) => replace(shards, notice('error', failed.message)));
  kb.addEventListener('change', () => loadShards(shards, kb.value));
}

async function loadNodes(element, rebalancing) {
  const title = h('h2', { id: 'nodes-title' }, t('cluster.nodes'));
  let view;
  try {
    view = await api('GET', '/v1/cluster');
  } catch (failed) {
    replace(element, title, notice(failed.status === 403 ? 'info' : 'error',
      failed.status === 403 ? t('cluster.operatorsOnly') : failed.message));
    return;
  }
  showRebalancing(rebalancing, view.rebalancing);
  replace(
    element,
    title,
    h('p', { class: 'meta' }, t('cluster.summary', { mode: view.mode, leader: view.leader ?? '—', term: view.term })),
    view.storage_failure ? notice('error', view.storage_failure) : null,
    h('div', { class: 'table-wrap' }, h('table', {},
      h('thead', {}, h('tr', {},
        ['cluster.node', 'cluster.role', 'cluster.health', 'cluster.address', 'cluster.applied', 'cluster.lastContact']
          .map((name) => h('th', { scope: 'col' }, t(name))))),
      h('tbody', {}, view.nodes.map((node) => h('tr', { dataset: { node: node.id } },
        h('th', { scope: 'row' }, node.id, node.id === view.id ? h('span', { class: 'badge' }, t('cluster.this')) : null),
        h('td', {}, node.role),
        h('td', {}, h('span', { class: `badge ${node.healthy ? 'status-ready' : 'status-failed'}` }, node.healthy ? t('cluster.healthy') : t('cluster.unhealthy'))),
        h('td', {}, node.listen || '—'),
        h('td', { class: 'num' }, node.applied ?? '—'),
        h('td', { class: 'num' }, node.last_contact_ms != null ? `${node.last_contact_ms} ms` : '—'),
      ))),
    )),
  );
}

/** Drains, replicas not serving yet and the next steps of `GET /v1/cluster`'s `rebalancing`. */
function showRebalancing(element, progress) {
  const title = h('h2', { id: 'rebalancing-title' }, t('cluster.rebalancing'));
  const { draining = [], replicas = [], planned = [] } = progress || {};
  if (!draining.length && !replicas.length && !planned.length) {
    replace(element, title, h('p', { class: 'empty' }, t('cluster.settled')));
    return;
  }
  const table = (caption, columns, rows) => h('div', { class: 'table-wrap' }, h('table', {},
    h('caption', {}, caption),
    h('thead', {}, h('tr', {}, columns.map((name) => h('th', { scope: 'col' }, t(name))))),
    h('tbody', {}, rows)));
  replace(
    element,
    title,
    draining.map((drain) => notice('info', t('cluster.draining', drain))),
    replicas.length ? table(t('cluster.moving'),
      ['cluster.kb', 'cluster.shard', 'cluster.node', 'cluster.state', 'cluster.sources', 'cluster.since'],
      replicas.map((replica) => h('tr', { dataset: { moving: `${replica.kb}/${replica.shard}/${replica.node}` } },
        h('th', { scope: 'row' }, replica.kb),
        h('td', { class: 'num' }, replica.shard),
        h('td', { class: 'num' }, replica.node),
        h('td', {}, h('span', { class: `badge replica-${replica.state}` }, replica.state)),
        h('td', {}, replica.sources.length ? replica.sources.join(', ') : '—'),
        h('td', {}, formatTime(replica.since_ms)),
      ))) : null,
    planned.length ? table(t('cluster.planned'),
      ['cluster.kb', 'cluster.shard', 'cluster.action', 'cluster.node', 'cluster.reason'],
      planned.map((step) => h('tr', { dataset: { planned: `${step.kb}/${step.shard}/${step.node}` } },
        h('th', { scope: 'row' }, step.kb),
        h('td', { class: 'num' }, step.shard),
        h('td', {}, t(`cluster.${step.action}`)),
        h('td', { class: 'num' }, step.node),
        h('td', {}, t(`cluster.${step.reason}`)),
      ))) : null,
  );
}

async function loadShards(element, kb) {
  let answer;
  try {
    answer = await api('GET', `/v1/kbs/${enc(kb)}/shards`);
  } catch (failed) {
    replace(element, notice('error', failed.message));
    return;
  }
  replace(element, h('div', { class: 'table-wrap' }, h('table', {},
    h('thead', {}, h('tr', {},
      ['cluster.shard', 'cluster.node', 'cluster.state', 'kbs.documents', 'cluster.chunks', 'cluster.since']
        .map((name) => h('th', { scope: 'col' }, t(name))))),
    h('tbody', {}, answer.shards.flatMap((shard) => shard.replicas.map((replica) => h('tr', {},
      h('th', { scope: 'row' }, shard.shard),
      h('td', {}, replica.node, replica.local ? h('span', { class: 'badge' }, t('cluster.this')) : null),
      h('td', {}, h('span', { class: `badge replica-${replica.state}` }, replica.state), replica.reachable ? null : ` ${t('cluster.unreachable')}`),
      h('td', { class: 'num' }, replica.documents ?? '—'),
      h('td', { class: 'num' }, replica.chunks ?? '—'),
      h('td', {}, formatTime(replica.since_ms)),
    )))),
  )));
}
