// A KB's documents: uploads (picker and drag and drop) with a live progress row each, from
// the document's event stream; the list a page at a time, filtered by status; a document's
// chunks; delete.
import { api, stream, enc } from './api.js';
import { h, replace, field, formatBytes, formatTime, notice, openDialog } from './dom.js';
import { t, statusLabel } from './i18n.js';

const STATUSES = ['queued', 'parsing', 'chunking', 'embedding', 'indexing', 'ready', 'failed'];
const FINAL = new Set(['ready', 'failed', 'deleted']);
const PAGE = 50;

export function render(main, route) {
  const kb = route.parts[0];
  const streams = new AbortController();
  const state = { kb, after: null, previous: [], filter: '' };
  const list = h('div', { 'aria-live': 'polite' }, t('loading'));
  const reload = () => load(list, state);
  main.append(
    h('p', { class: 'crumbs' }, h('a', { href: '#/kbs' }, t('kbs.title')), ' / ', kb),
    h('h1', {}, t('docs.title', { kb })),
    uploader(kb, streams.signal, reload),
    listControls(state, reload),
    list,
  );
  reload();
  return () => streams.abort();
}

function uploader(kb, signal, onFinal) {
  const input = h('input', { type: 'file', multiple: true, id: 'upload-files', class: 'visually-hidden' });
  const rows = h('ul', { class: 'uploads', 'aria-label': t('docs.uploads') });
  const zone = h(
    'div',
    { class: 'drop-zone' },
    h('p', {}, t('docs.drop')),
    h('label', { for: 'upload-files', class: 'button primary' }, t('docs.choose')),
    input,
  );
  const start = (files) => {
    for (const file of files) upload(kb, file, rows, signal, onFinal);
  };
  input.addEventListener('change', () => {
    start([...input.files]);
    input.value = '';
  });
  zone.addEventListener('dragover', (event) => {
    event.preventDefault();
    zone.classList.add('dragging');
  });
  zone.addEventListener('dragleave', () => zone.classList.remove('dragging'));
  zone.addEventListener('drop', (event) => {
    event.preventDefault();
    zone.classList.remove('dragging');
    start([...event.dataTransfer.files]);
  });
  return h('section', { class: 'card', 'aria-labelledby': 'upload-title' }, h('h2', { id: 'upload-title' }, t('docs.upload')), zone, rows);
}

/** Uploads one file and follows its document's events in a row of its own. */
async function upload(kb, file, rows, signal, onFinal) {
  const status = h('span', { class: 'status' }, t('docs.uploading'));
  const bar = h('progress', { max: 1, value: 0, 'aria-label': file.name });
  const detail = h('span', { class: 'detail' });
  const row = h('li', { class: 'upload', dataset: { file: file.name, status: 'uploading' } }, h('span', { class: 'name' }, file.name), bar, status, detail);
  rows.append(row);
  const show = (name, event = {}) => {
    row.dataset.status = name;
    status.textContent = statusLabel(name);
    status.className = `status badge status-${name}`;
    if (typeof event.progress === 'number') bar.value = event.progress;
    const steps = event.parse_pages || event.ocr_pages || event.embedded_chunks;
    detail.textContent = [
      steps ? `${steps.done}/${steps.total}` : '',
      event.chunk_count ? t('docs.chunkCount', { n: event.chunk_count }) : '',
      event.error || '',
    ]
      .filter(Boolean)
      .join(' · ');
  };
  const form = new FormData();
  form.append('file', file, file.name);
  let document;
  try {
    const answer = await api('POST', `/v1/kbs/${enc(kb)}/documents`, form, signal);
    document = answer.documents[0];
  } catch (failed) {
    if (failed.name === 'AbortError') return;
    show('failed', { error: `${failed.message} (${failed.code})` });
    return;
  }
  show(document.status || 'queued', document);
  let last = null;
  // The stream ends after the final event; a broken one is opened again (it starts with
  // the document's current status).
  for (let attempt = 0; attempt < 5 && !FINAL.has(row.dataset.status); attempt += 1) {
    try {
      await stream(`/v1/kbs/${enc(kb)}/documents/${enc(document.id)}/events`, {
        signal,
        onEvent: ({ event, data }) => {
          last = event;
          show(event, data);
        },
      });
    } catch (failed) {
      if (failed.name === 'AbortError') return;
      show('failed', { error: failed.message });
      return;
    }
  }
  if (last === 'ready') bar.value = 1;
  onFinal();
}

function listControls(state, reload) {
  const filter = h(
    'select',
    { name: 'status' },
    h('option', { value: '' }, t('docs.allStatuses')),
    STATUSES.map((status) => h('option', { value: status }, statusLabel(status))),
  );
  filter.addEventListener('change', () => {
    state.filter = filter.value;
    reload();
  });
  return h('div', { class: 'list-controls' }, h('h2', {}, t('docs.list')), field(t('docs.filter'), filter));
}

async function load(list, state) {
  let page;
  try {
    const after = state.after ? `&after=${enc(state.after)}` : '';
    page = await api('GET', `/v1/kbs/${enc(state.kb)}/documents?limit=${PAGE}${after}`);
  } catch (failed) {
    replace(list, notice('error', failed.message));
    return;
  }
  const documents = page.documents.filter((doc) => !state.filter || doc.status === state.filter);
  const pager = h(
    'div',
    { class: 'pager' },
    h('button', { type: 'button', disabled: state.previous.length === 0, onclick: () => {
      state.after = state.previous.pop() ?? null;
      load(list, state);
    } }, t('previous')),
    h('button', { type: 'button', disabled: !page.next_after, onclick: () => {
      state.previous.push(state.after);
      state.after = page.next_after;
      load(list, state);
    } }, t('next')),
  );
  if (documents.length === 0) {
    replace(list, h('p', { class: 'empty' }, t('docs.none')), pager);
    return;
  }
  const rows = documents.map((doc) => {
    const remove = h('button', { type: 'button', class: 'danger small', 'aria-label': `${t('delete')} ${doc.title}` }, t('delete'));
    remove.addEventListener('click', async () => {
      if (!confirm(t('docs.confirmDelete', { name: doc.title }))) return;
      try {
        await api('DELETE', `/v1/kbs/${enc(state.kb)}/documents/${enc(doc.id)}`);
        load(list, state);
      } catch (failed) {
        alert(failed.message);
      }
    });
    const chunks = h('button', { type: 'button', class: 'small' }, t('docs.chunks'));
    chunks.addEventListener('click', () => showChunks(state.kb, doc));
    return h(
      'tr',
      { dataset: { document: doc.id, status: doc.status } },
      h('th', { scope: 'row' }, doc.title || doc.external_id || doc.id),
      h('td', {}, h('span', { class: `badge status-${doc.status}` }, statusLabel(doc.status)), doc.error ? h('span', { class: 'detail' }, ` ${doc.error}`) : null),
      h('td', { class: 'num' }, doc.chunk_count),
      h('td', { class: 'num' }, formatBytes(doc.size_bytes)),
      h('td', {}, formatTime(doc.updated_at_ms)),
      h('td', { class: 'actions' }, chunks, remove),
    );
  });
  replace(
    list,
    h('div', { class: 'table-wrap' }, h(
      'table',
      {},
      h('thead', {}, h('tr', {},
        h('th', { scope: 'col' }, t('docs.name')),
        h('th', { scope: 'col' }, t('docs.status')),
        h('th', { scope: 'col' }, t('docs.chunks')),
        h('th', { scope: 'col' }, t('docs.size')),
        h('th', { scope: 'col' }, t('docs.updated')),
        h('th', { scope: 'col' }, h('span', { class: 'visually-hidden' }, t('actions'))),
      )),
      h('tbody', {}, rows),
    )),
    pager,
  );
}

async function showChunks(kb, doc) {
  openDialog(doc.title, t('loading'));
  try {
    const { chunks } = await api('GET', `/v1/kbs/${enc(kb)}/documents/${enc(doc.id)}/chunks`);
    openDialog(
      doc.title,
      h('ol', { class: 'chunks' }, chunks.map((chunk) => h(
        'li',
        { id: `chunk-${chunk.chunk_id}` },
        h('p', { class: 'meta' }, [
          (chunk.heading_path || []).join(' › '),
          chunk.pages ? t('pages', { first: chunk.pages.first, last: chunk.pages.last }) : '',
          `${t('span')} ${chunk.span?.[0]}–${chunk.span?.[1]}`,
        ].filter(Boolean).join(' · ')),
        h('p', { class: 'text' }, chunk.text),
      ))),
    );
  } catch (failed) {
    openDialog(doc.title, notice('error', failed.message));
  }
}
