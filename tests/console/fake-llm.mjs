// A scripted OpenAI-compatible chat model for the console's end-to-end test: a real HTTP
// server speaking the streaming wire format (`data: {chunk}` events, then `data: [DONE]`),
// with native tool calls. Like the Rust tests' `react_agent`: with no tool result yet it
// thinks aloud and calls `knowledge_search`; with results it calls `final_answer` citing the
// first two chunks it was shown, its arguments streamed slowly so that the console sees the
// answer arrive (and can reload mid-answer). A question with "ponder" in it thinks aloud and
// never finishes (for the stop button); "count to N" thinks the numbers 0 to N-1, one piece
// each, 5 ms apart (the console must keep up with a fast stream). Requests without tools (planner, summaries) get the
// question back as text.
// Usage: node fake-llm.mjs PORT [PIECE_DELAY_MS]
import { createServer } from 'node:http';

const port = Number(process.argv[2]);
const delay = Number(process.argv[3] || 120);

const chunk = (delta, finish = null) => ({
  id: 'chatcmpl-fake',
  object: 'chat.completion.chunk',
  created: 0,
  model: 'fake-model',
  choices: [{ index: 0, delta, finish_reason: finish }],
});
const usage = (prompt, completion) => ({
  id: 'chatcmpl-fake',
  object: 'chat.completion.chunk',
  choices: [],
  usage: { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion },
});

function split(text, parts) {
  const characters = [...text];
  const size = Math.max(1, Math.ceil(characters.length / parts));
  const pieces = [];
  for (let at = 0; at < characters.length; at += size) pieces.push(characters.slice(at, at + size).join(''));
  return pieces;
}

function texts(value, out = []) {
  if (typeof value === 'string') out.push(value);
  else if (Array.isArray(value)) value.forEach((item) => texts(item, out));
  else if (value && typeof value === 'object') Object.values(value).forEach((item) => texts(item, out));
  return out;
}

/** Chunk ids the agent showed the model (`chunk_id: DOC#N`), with the text under each. */
function shown(body) {
  const all = texts(body.messages).join('\n');
  const found = new Map();
  for (const match of all.matchAll(/chunk_id: ([^\s|\\"]+)/g)) {
    const id = match[1];
    if (!id.includes('#') || found.has(id)) continue;
    const rest = all.slice(match.index).split('\n').slice(1);
    const line = rest.find((text) => text.trim() && !/^(\[Context:|#)/.test(text.trim())) || '';
    found.set(id, line.trim());
  }
  return found;
}

function lastUser(body) {
  const user = [...body.messages].reverse().find((message) => message.role === 'user');
  return texts(user?.content).join(' ');
}

function reply(body) {
  const offers = (name) => (body.tools || []).some((tool) => tool.function?.name === name);
  const question = lastUser(body);
  if (!offers('final_answer')) {
    return { pieces: [chunk({ role: 'assistant', content: '' }), ...split(question, 3).map((piece) => chunk({ content: piece })), chunk({}, 'stop'), usage(40, 3)] };
  }
  const match = /count to (\d+)/i.exec(question);
  if (match && !body.messages.some((message) => message.role === 'tool')) {
    // a flood of thought pieces, one number each, 5 ms apart (about 200 a second)
    const numbers = Array.from({ length: Number(match[1]) }, (_, n) => chunk({ content: `${n} ` }));
    const answer = toolCall('call_answer', 'final_answer', { answer: `Counted to ${match[1]}.`, citations: [] }, 'Done. ');
    return { pieces: [chunk({ role: 'assistant', content: '' }), ...numbers, ...answer.slice(1)], delay: 5 };
  }
  if (/ponder/i.test(texts(body.messages).join(' '))) {
    const thinking = split('Let me ponder this slowly, one consideration after another. ', 6);
    return { pieces: [chunk({ role: 'assistant', content: '' }), ...thinking.map((piece) => chunk({ content: piece }))], hang: true };
  }
  const toolResults = body.messages.filter((message) => message.role === 'tool').length;
  const chunks = shown(body);
  if (toolResults === 0 || chunks.size === 0) {
    return { pieces: toolCall('call_search', 'knowledge_search', { query: question }, 'I should search the knowledge base for this. ') };
  }
  const ids = [...chunks.keys()].slice(0, 2);
  const answer = ids
    .map((id) => `${chunks.get(id).split(/\s+/).slice(0, 24).join(' ').replace(/[.,;:]+$/, '')} [${id}].`)
    .join(' ');
  return { pieces: toolCall('call_answer', 'final_answer', { answer, citations: ids }, 'I have what I need. ', 30) };
}

function toolCall(id, name, argumentsValue, thought, parts = 6) {
  const pieces = [chunk({ role: 'assistant', content: '' })];
  for (const piece of split(thought, 3)) pieces.push(chunk({ content: piece }));
  pieces.push(chunk({ tool_calls: [{ index: 0, id, type: 'function', function: { name, arguments: '' } }] }));
  for (const piece of split(JSON.stringify(argumentsValue), parts)) {
    pieces.push(chunk({ tool_calls: [{ index: 0, function: { arguments: piece } }] }));
  }
  pieces.push(chunk({}, 'tool_calls'));
  pieces.push(usage(120, parts));
  return pieces;
}

const server = createServer((request, response) => {
  let raw = '';
  request.on('data', (piece) => { raw += piece; });
  request.on('end', async () => {
    if (request.method !== 'POST' || !request.url.endsWith('/chat/completions')) {
      response.writeHead(404, { 'content-type': 'application/json' });
      response.end(JSON.stringify({ error: { message: 'no such route', type: 'invalid_request_error' } }));
      return;
    }
    let body;
    try {
      body = JSON.parse(raw);
    } catch {
      response.writeHead(400, { 'content-type': 'application/json' });
      response.end(JSON.stringify({ error: { message: 'bad JSON', type: 'invalid_request_error' } }));
      return;
    }
    const { pieces, hang, delay: pace = delay } = reply(body);
    response.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    let closed = false;
    response.on('close', () => { closed = true; });
    for (const piece of pieces) {
      if (closed) return;
      response.write(`data: ${JSON.stringify(piece)}\n\n`);
      await new Promise((resolve) => setTimeout(resolve, pace));
    }
    if (hang) return; // never ends: the run is stopped by the user
    response.end('data: [DONE]\n\n');
  });
});
server.listen(port, '127.0.0.1', () => console.log(`fake-llm: listening on ${port}`));
