'use strict';
// Shared by the Node.js client programs of tests/integration/test_other_clients.py:
// arguments, a STOMP 1.2 session on stompit (tests/clients/node/package.json), the JSON
// result line.
//
// Each program does one flow against --host/--port (a broker, or mq-sidecar in front of it)
// and prints, as its LAST stdout line, one JSON object: what it received, in order, and the
// errors it met. Progress lines before it are JSON objects too ({"progress": ...}). A
// watchdog bounds the whole run (--timeout seconds): on expiry the result so far is printed
// with an error and the program exits 2.

const stompit = require('stompit');
const stompitVersion = require('stompit/package.json').version;

/** Parse --name value pairs: the common options and the flow's own ({name: default}). */
function options(extra = {}) {
  const opts = { host: '127.0.0.1', port: 61613, dest: null, vhost: '/', timeout: 20, ...extra };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    const name = argv[i].replace(/^--/, '').replace(/-/g, '_');
    if (!(name in opts) || i + 1 >= argv.length) {
      throw new Error(`bad argument ${argv[i]}`);
    }
    const value = argv[i + 1];
    opts[name] = typeof opts[name] === 'number' ? Number(value) : value;
  }
  if (!opts.dest) {
    throw new Error('--dest is required');
  }
  return opts;
}

class Result {
  constructor(flow) {
    this.data = { client: `stompit ${stompitVersion}`, flow, errors: [] };
    this.printed = false;
  }

  error(text) {
    this.data.errors.push(String(text));
  }

  append(key, value) {
    (this.data[key] = this.data[key] || []).push(value);
  }

  progress(fields) {
    process.stdout.write(`${JSON.stringify({ progress: fields })}\n`);
  }

  /** Print the result line (once); returns the exit status to use. */
  emit() {
    if (this.printed) {
      return 0;
    }
    this.printed = true;
    process.stdout.write(`${JSON.stringify(this.data)}\n`);
    return this.data.errors.length === 0 ? 0 : 1;
  }
}

/** Run the async flow with a watchdog; print the result and exit. */
function run(flow, timeout, body) {
  const result = new Result(flow);
  const watchdog = setTimeout(() => {
    result.error(`timed out after ${timeout} s`);
    result.emit();
    process.exit(2);
  }, timeout * 1000);
  body(result)
    .catch((error) => result.error(error && error.message ? error.message : error))
    .finally(() => {
      clearTimeout(watchdog);
      const status = result.emit();
      process.stdout.write('', () => process.exit(status));
    });
}

/** What a received MESSAGE looks like in the result. */
function describe(message) {
  const headers = {};
  for (const [name, value] of Object.entries(message.headers)) {
    headers[name] = String(value);
  }
  return { body: message.body, headers };
}

/** A queue of values that are awaited in order. */
class Channel {
  constructor() {
    this.items = [];
    this.waiters = [];
  }

  put(item) {
    const waiter = this.waiters.shift();
    if (waiter) {
      waiter(item);
    } else {
      this.items.push(item);
    }
  }

  get() {
    if (this.items.length > 0) {
      return Promise.resolve(this.items.shift());
    }
    return new Promise((resolve) => this.waiters.push(resolve));
  }
}

/** One STOMP 1.2 connection; MESSAGEs of all its subscriptions go to one ordered channel. */
class Session {
  static open(opts, result) {
    return new Promise((resolve, reject) => {
      const connectOptions = {
        host: opts.host,
        port: opts.port,
        timeout: 10000,
        noDelay: true, // stompit writes a frame in pieces: without it Nagle costs ~40 ms a RECEIPT
        connectHeaders: { host: opts.vhost, 'accept-version': '1.2', 'heart-beat': '0,0' },
      };
      stompit.connect(connectOptions, (error, client) => {
        if (error) {
          reject(error);
        } else {
          resolve(new Session(client, result));
        }
      });
    });
  }

  constructor(client, result) {
    this.client = client;
    this.result = result;
    this.messages = new Channel();
    this.failure = null;
    client.on('error', (error) => {
      const text = `ERROR: ${error.message}${error.longMessage ? ` ${error.longMessage}` : ''}`;
      this.failure = error;
      result.error(text);
      this.messages.put(null);
    });
  }

  /** Write a frame made by stompit (client.send, tx.send...); resolve when written. */
  static write(frame, body) {
    return new Promise((resolve, reject) => {
      if (body !== undefined) {
        frame.write(body);
      }
      frame.end((error) => (error ? reject(error) : resolve()));
    });
  }

  /** stompit's send options that resolve the returned promise on the frame's RECEIPT. */
  static receipt() {
    let options;
    const received = new Promise((resolve) => {
      options = { onReceipt: () => resolve() };
    });
    return [options, received];
  }

  /** SEND; with receipt true, resolve once its RECEIPT arrived. */
  async send(destination, body, headers = {}, receipt = false) {
    const [options, received] = Session.receipt();
    await Session.write(this.client.send({ destination, ...headers }, receipt ? options : undefined), body);
    if (receipt) {
      await received;
    }
  }

  /** stompit's subscribe (it asks no receipt); MESSAGEs go to this session's channel. */
  subscribe(headers) {
    this.client.subscribe({ ...headers }, (error, message) => {
      if (error) {
        this.messages.put(null);
        return;
      }
      const entry = { headers: message.headers, body: null, frame: message };
      entry.ready = new Promise((done) => {
        message.readString('utf-8', (readError, text) => {
          entry.body = readError ? `<read error ${readError.message}>` : text;
          done();
        });
      });
      this.messages.put(entry);
    });
  }

  /** BEGIN; returns stompit's Transaction. */
  begin(name) {
    return this.client.begin(name);
  }

  /** COMMIT or ABORT (what) of a stompit Transaction, resolved on its RECEIPT. */
  finish(transaction, what) {
    const [options, received] = Session.receipt();
    transaction[what](options);
    return received;
  }

  /** The next MESSAGE: {headers, body, frame}. */
  async message() {
    const entry = await this.messages.get();
    if (entry === null) {
      throw new Error(`connection failed while waiting for a MESSAGE: ${this.failure && this.failure.message}`);
    }
    await entry.ready;
    return entry;
  }

  /** stompit's ack (headers id, subscription and message-id of the MESSAGE). */
  ack(message, headers = {}) {
    return new Promise((resolve, reject) => {
      this.client.ack(message.frame, headers, undefined, (error) => (error ? reject(error) : resolve()));
    });
  }

  /** MESSAGEs up to and including the one whose body is marker (each ACKed if ack). */
  async untilMarker(marker, ack = false) {
    const seen = [];
    for (let i = 0; i < 10000; i += 1) {
      const message = await this.message();
      if (ack) {
        await this.ack(message);
      }
      seen.push(message);
      if (message.body === marker) {
        return seen;
      }
    }
    throw new Error(`no ${marker} within 10000 messages`);
  }

  /** DISCONNECT with a receipt, and wait until the connection ends. */
  close() {
    return new Promise((resolve) => {
      this.client.disconnect((error) => {
        if (error) {
          this.result.error(`DISCONNECT: ${error.message}`);
        }
        resolve();
      });
    });
  }
}

module.exports = { options, run, describe, Session };
