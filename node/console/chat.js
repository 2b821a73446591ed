// Chat: sessions (newest first, titled by their first question), a new session over chosen
// KBs, and a conversation that streams a run's events: thoughts (collapsible), tool calls and
// results, the answer as it arrives with numbered citation markers, usage, errors, partial
// answers, a stop button. A run's events are kept in sessionStorage as they arrive, so a
// reload draws them again and resumes the stream after the last id (`Last-Event-ID`).
import { api, stream, enc } from './api.js';
import { h, replace, formatTime, notice, openDialog, field } from './dom.js';
import { t, placeLabel } from './i18n.js';
import { allKbs } from './kbs.js';

const saved = (session) => `sift.run.${session}`;

export function render(main, route) {
  const session = route.parts[0] || null;
  const controller = new AbortController();
  const sessions = h('nav', { class: 'sessions', 'aria-label': t('chat.sessions') }, t('loading'));
  const conversation = h('section', { class: 'conversation', 'aria-label': t('chat.conversation') });
  main.append(h('h1', {}, t('chat.title')), h('div', { class: 'chat-layout' }, h('aside', {}, newSession(), sessions), conversation));
  listSessions(sessions, session);
  const refresh = () => listSessions(sessions, session);
  if (session) openConversation(conversation, session, controller.signal, refresh);
  else conversation.append(h('p', { class: 'empty' }, t('chat.pick')));
  return () => controller.abort();
}

function newSession() {
  const boxes = h('div', { class: 'kb-choices' }, t('loading'));
  const status = h('p', { class: 'field-error', role: 'alert' });
  const form = h(
    'form',
    { class: 'card', 'aria-labelledby': 'new-session-title' },
    h('h2', { id: 'new-session-title' }, t('chat.new')),
    h('fieldset', {}, h('legend', {}, t('chat.kbs')), boxes),
    h('button', { type: 'submit', class: 'primary' }, t('chat.create')),
    status,
  );
  allKbs().then((kbs) => replace(boxes, kbs.length ? kbs.map((kb) => h('label', { class: 'check' },
    h('input', { type: 'checkbox', name: 'kb', value: kb.name }), ` ${kb.name}`)) : t('kbs.none')),
  (failed) => replace(boxes, failed.message));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const kbs = [...form.querySelectorAll('input[name=kb]:checked')].map((box) => box.value);
    if (kbs.length === 0) {
      status.textContent = t('chat.chooseKb');
      return;
    }
    try {
      const created = await api('POST', '/v1/sessions', { kbs });
      location.hash = `#/chat/${enc(created.id)}`;
    } catch (failed) {
      status.textContent = `${failed.message} (${failed.code})`;
    }
  });
  return form;
}

async function listSessions(element, current) {
  let page;
  try {
    page = await api('GET', '/v1/sessions?limit=50');
  } catch (failed) {
    replace(element, notice('error', failed.message));
    return;
  }
  if (page.sessions.length === 0) {
    replace(element, h('p', { class: 'empty' }, t('chat.noSessions')));
    return;
  }
  const items = page.sessions.map((session) => {
    const title = h('span', { class: 'title' }, t('chat.untitled'));
    // titled by the first question, read a page of one turn at a time
    if (session.turns > 0) {
      api('GET', `/v1/sessions/${enc(session.id)}/messages?limit=1`).then((turns) => {
        const first = turns.messages?.[0]?.question;
        if (first) title.textContent = first;
      }, () => {});
    }
    return h('li', {}, h('a', {
      href: `#/chat/${enc(session.id)}`,
      'aria-current': session.id === current ? 'page' : null,
    }, title, h('span', { class: 'meta' }, `${formatTime(session.updated_at_ms)} · ${session.kbs.length} KB`)));
  });
  replace(element, h('h2', {}, t('chat.sessions')), h('ul', {}, items));
}

async function openConversation(element, session, signal, onTurn) {
  const turns = h('ol', { class: 'turns' });
  const question = h('textarea', { name: 'question', rows: 3, required: true, maxlength: 8192 });
  const ask = h('button', { type: 'submit', class: 'primary' }, t('chat.ask'));
  const stop = h('button', { type: 'button', class: 'danger', hidden: true }, t('chat.stop'));
  const form = h('form', { class: 'ask' }, field(t('chat.question'), question), h('div', { class: 'row' }, ask, stop));
  const remove = h('button', { type: 'button', class: 'danger small' }, t('chat.delete'));
  remove.addEventListener('click', async () => {
    if (!confirm(t('chat.confirmDelete'))) return;
    await api('DELETE', `/v1/sessions/${enc(session)}`).catch((failed) => alert(failed.message));
    sessionStorage.removeItem(saved(session));
    location.hash = '#/chat';
  });
  replace(element, h('div', { class: 'conversation-head' }, h('h2', {}, t('chat.conversation')), remove), turns, form);
  let running = null;
  const busy = (run) => {
    running = run;
    ask.disabled = !!run;
    stop.hidden = !run;
  };
  stop.addEventListener('click', async () => {
    if (!running?.runId) return;
    stop.disabled = true;
    try {
      await api('POST', `/v1/runs/${enc(running.runId)}/stop`);
    } catch (failed) {
      if (failed.code !== 'run_finished') running.view.note('error', failed.message);
    } finally {
      stop.disabled = false;
    }
  });
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    if (running || !question.value.trim()) return;
    const text = question.value.trim();
    question.value = '';
    const run = { runId: null, question: text, events: [], done: false };
    const view = new RunView(text);
    turns.append(view.element);
    run.view = view;
    busy(run);
    await follow(session, run, signal, () => stream(`/v1/sessions/${enc(session)}/messages`, {
      method: 'POST',
      body: { content: text },
      signal,
      onEvent: (event) => take(session, run, event),
    }));
    busy(null);
    onTurn();
  });

  // stored turns first, then a run this tab had in flight
  try {
    const page = await api('GET', `/v1/sessions/${enc(session)}/messages?limit=1000`, undefined, signal);
    for (const message of page.messages || []) {
      const view = new RunView(message.question);
      for (const citation of message.citations || []) view.citations.set(citation.n, citation);
      view.answerText = message.answer || '';
      view.drawAnswer();
      view.finish(message.finish_reason);
      view.element.dataset.message = message.message_id;
      turns.append(view.element);
    }
  } catch (failed) {
    if (failed.name === 'AbortError') return;
    turns.append(notice('error', failed.message));
  }
  const kept = JSON.parse(sessionStorage.getItem(saved(session)) || 'null');
  if (kept && !kept.done && kept.runId) {
    const run = { ...kept, view: new RunView(kept.question) };
    turns.append(run.view.element);
    for (const event of run.events) run.view.take(event);
    run.view.note('info', t('chat.resumed'));
    busy(run);
    await follow(session, run, signal, null);
    busy(null);
    // the run may have ended between the reload and the read of the stored turns
    const done = run.events.find((event) => event.event === 'done');
    const stored = done?.data?.message_id
      && turns.querySelector(`[data-message="${CSS.escape(done.data.message_id)}"]`);
    if (stored) stored.remove();
    onTurn();
  }
}

/** Records an event of `run` (kept for a reload) and draws it. */
function take(session, run, event) {
  if (event.event === 'meta') run.runId = event.data.run_id;
  if (event.event === 'done') run.done = true;
  run.events.push({ event: event.event, data: event.data, id: event.id });
  run.lastId = event.id;
  const { view, ...rest } = run;
  try {
    if (run.done) sessionStorage.removeItem(saved(session));
    else sessionStorage.setItem(saved(session), JSON.stringify(rest));
  } catch {
    // storage full: a reload will start from the stored turns
  }
  view.take(event);
}

/** Streams the run until `done`; a broken stream resumes after the last event id. */
async function follow(session, run, signal, first) {
  let opener = first;
  for (let attempt = 0; !run.done && attempt < 10; attempt += 1) {
    try {
      if (opener) await opener();
      else {
        await stream(`/v1/runs/${enc(run.runId)}/events`, {
          lastEventId: run.lastId,
          signal,
          onEvent: (event) => take(session, run, event),
        });
      }
    } catch (failed) {
      if (failed.name === 'AbortError') return;
      if (failed.status && failed.status < 500) {
        sessionStorage.removeItem(saved(session));
        // a run kept past its retention is gone: its turn, if stored, is drawn already
        if (failed.status === 404 && !opener) run.view.element.remove();
        else run.view.note('error', `${failed.message} (${failed.code})`);
        return;
      }
      await new Promise((resolve) => setTimeout(resolve, 500 * (attempt + 1)));
    }
    opener = null;
    if (!run.runId) break;
  }
}

/** One question and its streamed answer. */
class RunView {
  constructor(question) {
    this.citations = new Map();
    this.answerText = '';
    this.thoughtText = '';
    this.thoughts = h('pre', { class: 'thought-text' });
    this.thoughtBox = h('details', { class: 'thoughts', hidden: true }, h('summary', {}, t('chat.thoughts')), this.thoughts);
    this.tools = h('ol', { class: 'tools' });
    this.answer = h('div', { class: 'answer', 'aria-live': 'polite' });
    this.sources = h('ol', { class: 'sources' });
    this.footer = h('p', { class: 'meta usage' });
    this.notes = h('div', { class: 'notes' });
    this.element = h('li', { class: 'turn', dataset: { state: 'running' } },
      h('p', { class: 'question' }, question),
      this.thoughtBox, this.tools, this.answer, this.sources, this.notes, this.footer);
  }

  take({ event, data }) {
    this.events = (this.events || 0) + 1;
    this.element.dataset.events = this.events;
    switch (event) {
      case 'thought':
        this.thoughtBox.hidden = false;
        this.thoughtText += data.delta || '';
        this.thoughts.textContent = this.thoughtText;
        break;
      case 'tool_call':
        this.tools.append(h('li', { class: 'tool', id: `tool-${data.id}` },
          h('details', {}, h('summary', {}, t('chat.toolCall', { name: data.name })),
            h('pre', {}, JSON.stringify(data.arguments, null, 2)))));
        break;
      case 'tool_result': {
        const at = this.tools.querySelector(`[id="tool-${CSS.escape(data.id)}"] details`) || this.tools;
        at.append(h('div', { class: 'tool-result' }, h('p', {}, data.summary),
          data.hits?.length ? h('ul', {}, data.hits.map((hit) => h('li', {}, `${hit.title} (${Number(hit.score).toFixed(3)})`))) : null));
        break;
      }
      case 'citation':
        this.citations.set(data.n, data);
        this.drawAnswer();
        break;
      case 'delta':
        this.answerText += data.text || '';
        this.drawAnswer();
        break;
      case 'usage':
        this.footer.textContent = t('chat.usage', {
          prompt: data.prompt_tokens,
          completion: data.completion_tokens,
          percent: Number(data.context_percent ?? 0).toFixed(1),
        });
        break;
      case 'partial':
        this.note('warning', t('chat.partial', {
          shards: (data.failed_shards || []).map((shard) => `${shard.shard} (${shard.reason})`).join(', '),
        }));
        break;
      case 'error':
        this.note('error', `${data.message} (${data.code})`);
        break;
      case 'done':
        this.finish(data.finish_reason);
        break;
      default:
        break; // meta, grounding: nothing to draw
    }
  }

  note(kind, text) {
    this.notes.append(notice(kind, text));
  }

  /** The answer text with each `[n]` of a known citation as a button opening it. */
  drawAnswer() {
    const pieces = this.answerText.split(/(\[\d+\])/);
    replace(this.answer, pieces.map((piece) => {
      const match = /^\[(\d+)\]$/.exec(piece);
      const citation = match && this.citations.get(Number(match[1]));
      if (!citation) return piece;
      return h('button', {
        type: 'button',
        class: 'cite',
        'aria-label': t('chat.openCitation', { n: citation.n, title: citation.document_title }),
        onclick: () => openCitation(citation),
      }, citation.n);
    }));
    this.drawSources();
  }

  drawSources() {
    const items = [...this.citations.values()].sort((a, b) => a.n - b.n).map((citation) =>
      h('li', { value: citation.n }, h('button', { type: 'button', class: 'link', onclick: () => openCitation(citation) },
        citation.document_title || citation.document_id)));
    replace(this.sources, items);
  }

  finish(reason) {
    this.element.dataset.state = reason || 'done';
    if (reason && reason !== 'stop' && reason !== 'completed') {
      this.footer.append(h('span', { class: 'badge' }, t('chat.finish', { reason })));
    }
  }
}

/** Opens the cited chunk, the cited text highlighted in it (the cited text alone until
 * the chunk has been read, or when it cannot be read). */
async function openCitation(citation) {
  const title = `[${citation.n}] ${citation.document_title || citation.document_id}`;
  const meta = (chunk) => h('p', { class: 'meta' }, [
    chunk?.heading_path?.length ? chunk.heading_path.join(' › ') : '',
    placeLabel(citation.pages, citation.heading_path?.length ? citation.heading_path : chunk?.heading_path),
    `${t('span')} ${citation.span?.[0]}–${citation.span?.[1]}`,
    citation.source_url || citation.external_id || '',
  ].filter(Boolean).join(' · '));
  // a document fetched by URL links to its page (after redirects); only http(s) links
  const source = /^https?:\/\//.test(citation.source_url || '')
    ? [' · ', h('a', { href: citation.source_url, target: '_blank', rel: 'noopener noreferrer' }, t('chat.openSource'))]
    : [];
  const link = h('p', {}, [h('a', { href: `#/kbs/${enc(citation.kb_id)}` }, t('chat.openKb')), ...source]);
  openDialog(title, meta(null), h('blockquote', { class: 'cited' }, h('mark', {}, citation.text)), link);
  let chunk;
  try {
    const { chunks } = await api('GET', `/v1/kbs/${enc(citation.kb_id)}/documents/${enc(citation.document_id)}/chunks`);
    chunk = chunks.find((one) => one.chunk_id === citation.chunk_id);
  } catch {
    return; // the cited text stays on its own
  }
  const dialog = document.getElementById('dialog');
  if (!chunk || !dialog.open || document.getElementById('dialog-title').textContent !== title) return;
  const at = chunk.text.indexOf(citation.text);
  const body = at < 0
    ? [h('mark', {}, citation.text), '\n\n', chunk.text]
    : [chunk.text.slice(0, at), h('mark', {}, citation.text), chunk.text.slice(at + citation.text.length)];
  openDialog(title, meta(chunk), h('blockquote', { class: 'cited chunk-text' }, body), link);
}
