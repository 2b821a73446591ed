// Knowledge bases: the list with document counts by status and sizes, create, delete.
import { api, enc, errorField } from './api.js';
import { h, replace, field, formatBytes, formatTime, notice, openDialog } from './dom.js';
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
      h('td', { class: 'num' }, kb.chunks ?? '—'),
      kb.stored_bytes == null
        ? h('td', { class: 'num', title: t('kbs.sizeHidden') }, '—')
        : h('td', { class: 'num', dataset: { bytes: kb.stored_bytes } }, formatBytes(kb.stored_bytes)),
      h('td', { class: 'num' }, `${kb.settings?.shards ?? ''} × ${kb.settings?.replication_factor ?? ''}`),
      h('td', {}, formatTime(kb.created_at_ms)),
      h(
        'td',
        { class: 'actions' },
        h('a', { href: `#/search?kb=${enc(kb.name)}`, class: 'button small' }, t('nav.search')),
        h('a', { href: `#/cluster?kb=${enc(kb.name)}`, class: 'button small' }, t('kbs.shards')),
        kb.read_only ? null : h('button', {
          type: 'button',
          class: 'small',
          'aria-label': `${t('kbs.settings')} ${kb.name}`,
          onclick: () => editSettings(kb, () => load(list)),
        }, t('kbs.settings')),
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
            h('th', { scope: 'col' }, t('kbs.chunks')),
            h('th', { scope: 'col' }, t('kbs.size')),
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
  const shards = h('input', { name: 'shards', type: 'number', min: 1, max: 64, placeholder: '2' });
  const replication = h('input', {
    name: 'replication_factor',
    type: 'number',
    min: 1,
    max: 9,
    placeholder: t('kbs.auto'),
  });
  const chunking = chunkingControls({});
  const fields = {
    name: field(t('kbs.name'), name, t('kbs.nameHint')),
    shards: field(t('kbs.shardCount'), shards),
    replication_factor: field(t('kbs.replication'), replication),
  };
  const more = h('details', { class: 'more' }, h('summary', {}, t('kbs.moreSettings')),
    h('div', { class: 'row' }, Object.values(chunking.fields)));
  const status = h('p', { class: 'form-status', role: 'status' });
  const form = h(
    'form',
    { class: 'card inline-form', 'aria-labelledby': 'kb-create-title' },
    h('h2', { id: 'kb-create-title' }, t('kbs.create')),
    h('div', { class: 'row' }, Object.values(fields)),
    more,
    h('button', { type: 'submit', class: 'primary' }, t('kbs.createButton')),
    status,
  );
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    for (const wrapper of [...Object.values(fields), ...Object.values(chunking.fields)]) {
      wrapper.querySelector('.field-error').textContent = '';
    }
    status.textContent = '';
    const body = { name: name.value.trim(), ...chunking.read() };
    if (shards.value) body.shards = Number(shards.value);
    if (replication.value) body.replication_factor = Number(replication.value);
    try {
      await api('POST', '/v1/kbs', body);
      status.textContent = t('kbs.created_', { name: body.name });
      name.value = '';
      onCreated();
    } catch (failed) {
      // the API names the field at fault in `param`; a name error may come without one
      const all = { ...fields, ...chunking.fields };
      const at = all[errorField(failed, Object.keys(all))];
      if (at && more.contains(at)) more.open = true;
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

const OCR = ['auto', 'off', 'vision', 'tesseract'];
const GRAPH = ['embedded', 'llm', 'off'];

/** The chunking and parsing settings both create and PATCH take; `read` gives those set. */
function chunkingControls(settings) {
  const number = (name, min, max) => h('input', {
    name,
    type: 'number',
    min,
    max,
    value: settings[name] ?? '',
    placeholder: settings[name] == null ? t('kbs.default') : null,
  });
  const controls = {
    chunk_tokens: number('chunk_tokens', 16, 8192),
    chunk_overlap_tokens: number('chunk_overlap_tokens', 0, 4096),
    parent_tokens: number('parent_tokens', 0, 65536),
    language: h('input', { name: 'language', value: settings.language ?? '', placeholder: 'auto' }),
    ocr: h('select', { name: 'ocr' },
      settings.ocr ? null : h('option', { value: '' }, t('kbs.default')),
      OCR.map((engine) => h('option', { value: engine, selected: settings.ocr === engine }, engine))),
    graph: h('select', { name: 'graph' },
      settings.graph ? null : h('option', { value: '' }, t('kbs.default')),
      GRAPH.map((extractor) => h('option', { value: extractor, selected: settings.graph === extractor }, extractor))),
    graph_token_budget: number('graph_token_budget', 0, null),
  };
  const labels = {
    chunk_tokens: t('kbs.chunkTokens'),
    chunk_overlap_tokens: t('kbs.chunkOverlap'),
    parent_tokens: t('kbs.parentTokens'),
    language: t('kbs.language'),
    ocr: t('kbs.ocr'),
    graph: t('kbs.graph'),
    graph_token_budget: t('kbs.graphBudget'),
  };
  const fields = Object.fromEntries(Object.entries(controls).map(([name, control]) => [name, field(labels[name], control)]));
  const read = () => {
    const body = {};
    for (const [name, control] of Object.entries(controls)) {
      if (control.value === '' || String(settings[name] ?? '') === control.value) continue;
      body[name] = control.type === 'number' ? Number(control.value) : control.value;
    }
    return body;
  };
  return { fields, read };
}

/** The settings of a KB that PATCH may change: chunking, parsing and every retrieval setting. */
function editSettings(kb, onSaved) {
  const settings = kb.settings || {};
  const chunking = chunkingControls(settings);
  const retrieval = settings.retrieval || {};
  const retrievalControls = Object.fromEntries(Object.entries(retrieval).map(([name, value]) => {
    if (typeof value === 'boolean') return [name, h('input', { type: 'checkbox', name, checked: value })];
    if (typeof value === 'number') return [name, h('input', { type: 'number', name, step: 'any', value })];
    return [name, h('input', { name, value: value ?? '' })];
  }));
  const retrievalFields = Object.fromEntries(Object.entries(retrievalControls).map(([name, control]) => [
    name,
    control.type === 'checkbox'
      ? h('div', { class: 'field' }, h('label', { class: 'check' }, control, ` ${name}`), h('p', { class: 'field-error', role: 'alert' }))
      : field(name, control),
  ]));
  const status = h('p', { class: 'form-status', role: 'status' });
  const form = h('form', { class: 'settings' },
    h('p', { class: 'meta' }, t('kbs.fixed', {
      shards: settings.shards,
      replication: settings.replication_factor,
      model: settings.embedding_model,
    })),
    h('div', { class: 'row' }, Object.values(chunking.fields)),
    h('fieldset', {}, h('legend', {}, t('kbs.retrieval')), h('div', { class: 'row' }, Object.values(retrievalFields))),
    h('button', { type: 'submit', class: 'primary' }, t('save')),
    status);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    for (const error of form.querySelectorAll('.field-error')) error.textContent = '';
    const body = chunking.read();
    const changed = {};
    for (const [name, control] of Object.entries(retrievalControls)) {
      const value = control.type === 'checkbox' ? control.checked
        : control.type === 'number' ? Number(control.value) : control.value;
      if (value !== retrieval[name]) changed[name] = value;
    }
    if (Object.keys(changed).length) body.retrieval = changed;
    if (Object.keys(body).length === 0) {
      status.textContent = t('kbs.unchanged');
      return;
    }
    try {
      await api('PATCH', `/v1/kbs/${enc(kb.id)}`, body);
      document.getElementById('dialog').close();
      onSaved();
    } catch (failed) {
      const all = { ...chunking.fields, ...retrievalFields };
      const at = all[errorField(failed, Object.keys(all))];
      const message = `${failed.message} (${failed.code})`;
      if (at) at.querySelector('.field-error').textContent = message;
      else status.textContent = message;
    }
  });
  openDialog(t('kbs.settingsOf', { name: kb.name }), form);
}
