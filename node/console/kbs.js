// Knowledge bases: the list with document counts by status, create, delete.
import { api, enc } from './api.js';
import { h, replace, field, formatTime, notice } from './dom.js';
import { t, statusLabel } from './i18n.js';

const STATUSES = ['queued', 'parsing', 'chunking', 'embedding', 'indexing', 'ready', 'failed'];

export function render(main) {
  const list = h('div', { class: 'kb-list', 'aria-live': 'polite' }, t('loading'));
  main.append(h('h1', {}, t('kbs.title')), createForm(() => load(list)), list);
  load(list);
}

/** The KBs of the caller, every page. */
export async function allKbs() {
  const kbs = [];
  let after = null;
  do {
    const page = await api('GET', `/v1/kbs?limit=1000${after ? `&after=${enc(after)}` : ''}`);
    kbs.push(...page.kbs);
    after = page.next_after;
  } while (after);
  return kbs;
}

async function load(list) {
  let kbs;
  try {
    kbs = await allKbs();
  } catch (failed) {
    replace(list, notice('error', failed.message));
    return;
  }
  if (kbs.length === 0) {
    replace(list, h('p', { class: 'empty' }, t('kbs.none')));
    return;
  }
  const rows = kbs.map((kb) => {
    const counts = kb.documents || {};
    const byStatus = STATUSES.filter((status) => counts[status]).map((status) =>
      h('span', { class: `badge status-${status}` }, `${statusLabel(status)} ${counts[status]}`),
    );
    const remove = h(
      'button',
      { type: 'button', class: 'danger small', 'aria-label': `${t('delete')} ${kb.name}` },
      t('delete'),
    );
    remove.addEventListener('click', async () => {
      if (!confirm(t('kbs.confirmDelete', { name: kb.name }))) return;
      try {
        await api('DELETE', `/v1/kbs/${enc(kb.id)}`);
        load(list);
      } catch (failed) {
        alert(failed.message);
      }
    });
    return h(
      'tr',
      { dataset: { kb: kb.name } },
      h('th', { scope: 'row' }, h('a', { href: `#/kbs/${enc(kb.name)}` }, kb.name), kb.read_only ? h('span', { class: 'badge' }, t('kbs.readOnly')) : null),
      h('td', { class: 'num' }, counts.total ?? 0),
      h('td', {}, byStatus.length ? byStatus : '—'),
      h('td', { class: 'num' }, `${kb.settings?.shards ?? ''} × ${kb.settings?.replication_factor ?? ''}`),
      h('td', {}, formatTime(kb.created_at_ms)),
      h(
        'td',
        { class: 'actions' },
        h('a', { href: `#/search?kb=${enc(kb.name)}`, class: 'button small' }, t('nav.search')),
        h('a', { href: `#/cluster?kb=${enc(kb.name)}`, class: 'button small' }, t('kbs.shards')),
        kb.read_only ? null : remove,
      ),
    );
  });
  replace(
    list,
    h(
      'div',
      { class: 'table-wrap' },
      h(
        'table',
        {},
        h('caption', { class: 'visually-hidden' }, t('kbs.title')),
        h(
          'thead',
          {},
          h(
            'tr',
            {},
            h('th', { scope: 'col' }, t('kbs.name')),
            h('th', { scope: 'col' }, t('kbs.documents')),
            h('th', { scope: 'col' }, t('kbs.byStatus')),
            h('th', { scope: 'col' }, t('kbs.shardsReplicas')),
            h('th', { scope: 'col' }, t('kbs.created')),
            h('th', { scope: 'col' }, h('span', { class: 'visually-hidden' }, t('actions'))),
          ),
        ),
        h('tbody', {}, rows),
      ),
    ),
  );
}

function createForm(onCreated) {
  const name = h('input', { name: 'name', required: true, autocomplete: 'off', maxlength: 64 });
  const shards = h('input', { name: 'shards', type: 'number', min: 1, max: 256, value: 1 });
  const replication = h('input', {
    name: 'replication_factor',
    type: 'number',
    min: 1,
    max: 9,
    value: 1,
  });
  const fields = {
    name: field(t('kbs.name'), name, t('kbs.nameHint')),
    shards: field(t('kbs.shardCount'), shards),
    replication_factor: field(t('kbs.replication'), replication),
  };
  const status = h('p', { class: 'form-status', role: 'status' });
  const form = h(
    'form',
    { class: 'card inline-form', 'aria-labelledby': 'kb-create-title' },
    h('h2', { id: 'kb-create-title' }, t('kbs.create')),
    h('div', { class: 'row' }, Object.values(fields)),
    h('button', { type: 'submit', class: 'primary' }, t('kbs.createButton')),
    status,
  );
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    for (const wrapper of Object.values(fields)) {
      wrapper.querySelector('.field-error').textContent = '';
    }
    status.textContent = '';
    const body = {
      name: name.value.trim(),
      shards: Number(shards.value),
      replication_factor: Number(replication.value),
    };
    try {
      await api('POST', '/v1/kbs', body);
      status.textContent = t('kbs.created_', { name: body.name });
      name.value = '';
      onCreated();
    } catch (failed) {
      // the API names the field at fault in `param`; a name error may come without one
      const at = fields[failed.param] || (failed.code.includes('name') ? fields.name : null);
      const message = `${failed.message} (${failed.code})`;
      if (at) {
        at.querySelector('.field-error').textContent = message;
        at.querySelector('input').focus();
      } else {
        status.textContent = message;
      }
    }
  });
  return form;
}
